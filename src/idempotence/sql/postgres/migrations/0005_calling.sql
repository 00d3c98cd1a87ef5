-- 0005_calling: the non-idempotent foreign call a key's worker began, in a column of
-- its own (R6).

-- Set by the checkpoint that commits just before a non-idempotent foreign call, and
-- cleared by every later fenced write of the key (the checkpoint of the phase that
-- records the call's result, the checkpoint back to the step's point after a
-- determinate failure, the finish). A claim that finds it set knows a worker died
-- during that call, whose outcome is unknown: the key is errored, never called again.
ALTER TABLE idempotency_keys ADD COLUMN calling text;

-- Rows written before this column existed carried the mark in the recovery point
-- ('<point>~calling:<name>'; flow names and points could not hold '~'): the point
-- goes back to the step's own, and the name moves here.
UPDATE idempotency_keys
SET calling = substr(recovery_point, strpos(recovery_point, '~calling:') + 9),
    recovery_point = substr(recovery_point, 1, strpos(recovery_point, '~calling:') - 1)
WHERE strpos(recovery_point, '~calling:') > 0;
