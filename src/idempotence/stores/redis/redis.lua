-- The Redis key store's scripts (DESIGN 4, 6, 8): one Lua script per operation, so
-- each operation is atomic on the server. Read by stores/redis/_store_shared.py: every block
-- opened by a `-- name --` line is one script, with the `prelude` block put in front
-- of each (comment lines are stripped, as in the SQL query files). redis-py loads a
-- script once (SCRIPT LOAD) and runs it by EVALSHA, loading it again on NOSCRIPT.
--
-- One record is one hash, KEYS[1], whose name carries the scope and the key behind a
-- hash tag of their digest (stores/redis/_store_shared.py: record_key), so a record never
-- spans two cluster slots. Its fields:
--   id        a random number chosen by the first claim: a lease names the record's
--             incarnation, so a zombie of a forgotten or expired key cannot write to
--             the key's next incarnation, whose token starts at 1 again (F1)
--   scope key method path fp params flow   the request, as claimed (DESIGN 3)
--   rp        the recovery point (`started`, `finished`)
--   token     the fencing token: 1 at the first claim, + 1 at every takeover (F1)
--   locked    when the lock was taken or last extended, in microseconds since the
--             epoch; absent when unlocked
--   lto       the lock timeout, in microseconds
--   ret       the retention, in microseconds; absent: kept forever
--   created last_run finished expires   times, microseconds (absent: none)
--   status headers body error calling   the stored response (R6: error, calling)
--   waiting   present while a twin waits for the key to settle (P10)
--
-- Every time comes from the server's clock (TIME), never the client's. The hash's
-- TTL follows DESIGN B3 as far as Redis can: it is `expires` (the retention counted
-- from the claim, and again from the finish), but never earlier than the end of a
-- live lock, so a locked key never vanishes under its worker.

-- prelude --
-- Now, in microseconds since the epoch, by the server's clock. 1.7e15 is well inside
-- the 2^53 that a Lua number holds exactly.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Whether a lock taken at `locked` (absent: unlocked) for `lto` microseconds still
-- holds at `now`: the one test of P4 (states.arbitrate), shared by every script.
local function live(locked, lto, now)
  if not locked then
    return false
  end
  return tonumber(locked) + tonumber(lto) > now
end

-- A whole number as Redis stores it: digits, never an exponent (tostring gives
-- 1.7e+15). '%d' (Lua 5.1 formats it as a C long: 64 bits on the LP64 builds Redis
-- ships, so exact up to the 2^53 a Lua number holds) rather than '%.0f': printf's float
-- path cost the server some 4 000 instructions per number (callgrind), a tenth of a
-- claim's script.
local function int(n)
  return string.format('%d', n)
end

-- The record's TTL: until `expires` (its value, read by the caller with the fields it
-- reads anyway), or until the lock ends if that is later. A record kept forever (`ret`
-- absent) has no `expires` and never had a TTL: no script gives it one (the retention
-- is fixed at the first claim), so there is nothing to PERSIST, and no command is sent.
local function set_expiry(k, expires, locked_until)
  if not expires then
    return
  end
  local at = tonumber(expires)
  if locked_until and locked_until > at then
    at = locked_until
  end
  redis.call('PEXPIREAT', k, int(math.ceil(at / 1000)))
end

-- The record's values as ONE string: the length of each value as a 4-byte big-endian
-- signed integer (-1 for an absent field), then the values that are present, one after
-- the other (stores/redis/_store_shared.py: unpack, which reads the lengths in one call). A
-- reply of twenty-odd elements costs the client a parser call per element (pure Python
-- in redis-py without hiredis: most of a replay's CPU); one bulk string costs one.
-- The fields, in this order, are stores/redis/_store_shared.py's READ_FIELDS (the same list).
-- The list is built here, not in the prelude: the prelude runs at every call of every
-- script, and building it there cost every call some 4 000 server instructions
-- (callgrind), a third of what a command called from a script costs. The lengths start
-- as a table of -1 of the list's size, the packed lengths go in the first slot of the
-- one table that table.concat joins, and struct.pack's format is written out (one i4
-- per field): no table grows, no format is built, one string is made, at every replay
-- (some 15 000 instructions fewer than growing them, a tenth of a replay's script).
local function read(k)
  local READ_FIELDS = {'id', 'scope', 'key', 'method', 'path', 'fp', 'params', 'flow',
    'rp', 'token', 'locked', 'lto', 'created', 'last_run', 'finished', 'expires',
    'status', 'headers', 'body', 'error', 'calling'}
  local values = redis.call('HMGET', k, unpack(READ_FIELDS))
  local lengths = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1}
  local out, n = {''}, 1
  for i = 1, #READ_FIELDS do
    local v = values[i]
    if v then
      lengths[i] = #v
      n = n + 1
      out[n] = v
    end
  end
  out[1] = struct.pack('>i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4i4', unpack(lengths))
  return table.concat(out)
end

-- The lock check of every fenced write (F1), on `cur`, the reply of an HMGET whose
-- first three fields are id, token and finished: the record is the incarnation the
-- lease was given (id), nobody took it over since (token), and it is not finished.
-- Each fenced script reads these with the other fields it needs in one HMGET: every
-- command a script calls costs the server about as much as a small command sent alone.
local function holds(cur, id, token)
  return cur[1] == id and cur[2] == token and not cur[3]
end

-- P10: wake the twins waiting for this key (the caller read its `waiting` flag, set
-- by mark_waiter) on the store's channel; the payload is the JSON array [scope, key],
-- as on PostgreSQL.
local function settled(k, channel)
  redis.call('PUBLISH', channel, cjson.encode(redis.call('HMGET', k, 'scope', 'key')))
end

-- claim --
-- P1-P6 in one atomic step. ARGV: scope, key, fingerprint, method, path, flow, params
-- (JSON), lock timeout (us), retention (us, or '' for forever), a new id, '1' when the
-- store waits for replicas (stores/redis/_replicas.py) else '0'.
-- Returns {1 if this claim took the lock else 0, now, the record's values (read)}; the
-- caller names the outcome with states.claim_from, which checks that this script and
-- states.arbitrate agree. A new key returns {1, now} only: its record is the request
-- as written here, which the caller rebuilds (stores/redis/_store_shared.py: new_record)
-- rather than have every fresh claim read some forty values back.
local k = KEYS[1]
local now = now_us()
local cur = redis.call('HMGET', k, 'fp', 'finished', 'locked', 'lto')
if not cur[1] then
  -- P1: a new key, locked with token 1, written by one HSET, and its TTL (the later
  -- of its expiry and the end of its lock) set without reading anything back: every
  -- command a script calls costs the server about as much as a small command sent
  -- alone. The hash is a listpack, which Redis searches field by field: the fields
  -- that the claims, the finish and the fence look up come first, the request's
  -- description (read back only whole) last.
  local at = int(now)
  local locked_until = now + tonumber(ARGV[8])
  if ARGV[9] == '' then
    redis.call('HSET', k,
      'fp', ARGV[3], 'id', ARGV[10], 'token', '1', 'locked', at, 'lto', ARGV[8],
      'rp', 'started', 'created', at, 'last_run', at, 'scope', ARGV[1], 'key', ARGV[2],
      'method', ARGV[4], 'path', ARGV[5], 'flow', ARGV[6], 'params', ARGV[7])
    return {1, at}
  end
  local expires = now + tonumber(ARGV[9])
  redis.call('HSET', k,
    'fp', ARGV[3], 'id', ARGV[10], 'token', '1', 'locked', at, 'lto', ARGV[8],
    'ret', ARGV[9], 'expires', int(expires), 'rp', 'started', 'created', at, 'last_run', at,
    'scope', ARGV[1], 'key', ARGV[2], 'method', ARGV[4], 'path', ARGV[5], 'flow', ARGV[6],
    'params', ARGV[7])
  redis.call('PEXPIREAT', k, int(math.ceil(math.max(expires, locked_until) / 1000)))
  return {1, at}
end
-- P2 (another request's key) before P3 (finished) before P4 (a live lock): the key is
-- only read, and the caller says which of the three it is.
if cur[1] ~= ARGV[3] or cur[2] or live(cur[3], cur[4], now) then
  if cur[2] and ARGV[11] == '1' then
    -- A finished key read for a store that waits for replicas: its finish may not be
    -- on any replica yet. WAIT is documented to cover the connection's own writes
    -- (Redis 7.0 happens to count from its last command of any kind), so one write,
    -- the finish time again, unchanged, puts this connection's WAIT after the finish
    -- in the replication stream: the replay is answered only once the finish would
    -- survive a failover.
    redis.call('HSET', k, 'finished', cur[2])
  end
  return {0, int(now), read(k)}
end
-- P5: unlocked, or its holder's lock expired: take over with a new token (F1). The
-- token and the expiry are read here, not by the HMGET above, which every replay sends.
local was = redis.call('HMGET', k, 'token', 'expires')
local at = int(now)
redis.call('HSET', k, 'token', int(tonumber(was[1]) + 1), 'locked', at, 'lto', ARGV[8],
  'last_run', at)
set_expiry(k, was[2], now + tonumber(ARGV[8]))
return {1, at, read(k)}

-- finish --
-- Store the response and unlock, fenced (P3, F1). ARGV: id, token, status, headers
-- (JSON), body, '1' if errored (R6) else '0', the error, the channel (P10).
-- The retention window restarts at the finish, as on the SQL stores. The fence, the
-- retention and the waiting flag are read by one HMGET, and the record is written by
-- one HSET and one HDEL: each command a script calls costs the server about as much
-- as a small command sent alone.
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'id', 'token', 'finished', 'ret', 'waiting')
if not holds(cur, ARGV[1], ARGV[2]) then
  return 0
end
local now = now_us()
local fields = {'rp', 'finished', 'status', ARGV[3], 'headers', ARGV[4], 'body', ARGV[5],
  'finished', int(now)}
local gone = {'locked', 'calling'}
if ARGV[6] == '1' then
  fields[#fields + 1] = 'error'
  fields[#fields + 1] = ARGV[7]
else
  gone[#gone + 1] = 'error'
end
local expires = nil
if cur[4] then
  expires = now + tonumber(cur[4])
  fields[#fields + 1] = 'expires'
  fields[#fields + 1] = int(expires)
end
if cur[5] then
  gone[#gone + 1] = 'waiting'
end
redis.call('HSET', k, unpack(fields))
redis.call('HDEL', k, unpack(gone))
-- The record's TTL, with no lock: its new expiry (none if kept forever).
set_expiry(k, expires, nil)
-- P10: wake the twins that marked the key.
if cur[5] then
  settled(k, ARGV[8])
end
return 1

-- release --
-- Unlock without finishing, fenced (R5): the next claim resumes. ARGV: id, token,
-- the channel. An unlocked record keeps its `expires`: past it, Redis drops it (the
-- SQL reaper would store a 408 failure first; see docs/how-to/redis.md).
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'id', 'token', 'finished', 'expires', 'waiting')
if not holds(cur, ARGV[1], ARGV[2]) then
  return 0
end
if cur[5] then
  redis.call('HDEL', k, 'locked', 'waiting')
else
  redis.call('HDEL', k, 'locked')
end
set_expiry(k, cur[4], nil)
if cur[5] then
  settled(k, ARGV[3])
end
return 1

-- heartbeat --
-- Extend a held lock by its timeout from now, fenced (F2); returns the new `locked`.
-- ARGV: id, token.
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'id', 'token', 'finished', 'locked', 'lto', 'expires')
if not holds(cur, ARGV[1], ARGV[2]) or not cur[4] then
  return false
end
local now = now_us()
local at = int(now)
redis.call('HSET', k, 'locked', at)
set_expiry(k, cur[6], now + tonumber(cur[5]))
return at

-- forget --
-- Delete a key still at `started`, fenced (R5: a rejected request stores nothing).
-- ARGV: id, token, the channel.
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'id', 'token', 'finished', 'rp', 'waiting')
if not holds(cur, ARGV[1], ARGV[2]) or cur[4] ~= 'started' then
  return 0
end
if cur[5] then
  settled(k, ARGV[3])
end
redis.call('DEL', k)
return 1

-- mark_waiter --
-- P10: ask for a message on the channel when the key settles. Returns 0 when there
-- is nothing to wait for (no record, finished, or no live lock: a lock past its
-- timeout is free to take over now, and no one will settle it): the caller claims
-- again.
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'finished', 'locked', 'lto')
if cur[1] or not live(cur[2], cur[3], now_us()) then
  return 0
end
redis.call('HSET', k, 'waiting', '1')
return 1

-- evict --
-- The operator's `keys evict` (F5): delete the record unless a live lock holds it
-- (ARGV[1] = '1' forces). Returns 1 deleted, 0 refused (locked), -1 no such key.
local k = KEYS[1]
local cur = redis.call('HMGET', k, 'fp', 'locked', 'lto', 'finished')
if not cur[1] then
  return -1
end
if not cur[4] and live(cur[2], cur[3], now_us()) and ARGV[1] ~= '1' then
  return 0
end
redis.call('DEL', k)
return 1

-- status --
-- A key's status (key_status): its record and the server's clock, read in one atomic
-- step, so the state is named on the clock that wrote the record, as a claim's is.
-- Returns {now} for no such key, else {now, the record's values (read)}.
local k = KEYS[1]
local now = now_us()
if redis.call('EXISTS', k) == 0 then
  return {int(now)}
end
return {int(now), read(k)}
