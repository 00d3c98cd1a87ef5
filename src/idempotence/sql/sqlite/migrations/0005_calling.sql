-- 0005_calling: the non-idempotent foreign call a key's worker began, in a column of
-- its own (R6). See the PostgreSQL twin. (Numbered as there: SQLite has no 0004.)

ALTER TABLE idempotency_keys ADD COLUMN calling TEXT;

-- Rows written before this column existed carried the mark in the recovery point.
UPDATE idempotency_keys
SET calling = substr(recovery_point, instr(recovery_point, '~calling:') + 9),
    recovery_point = substr(recovery_point, 1, instr(recovery_point, '~calling:') - 1)
WHERE instr(recovery_point, '~calling:') > 0;
