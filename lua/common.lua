-- redlimit: the driver. One script holds it and every algorithm's step: Rust splices the steps
-- (`lua/<algorithm>.lua`) in at the `@steps` line below (the loop over tiers), each as a branch
-- `elseif alg == <tag byte> then <step>`, and the packed-state steps once more at the
-- `@packed-steps` line (the one-tier path, which spares the usual call the loop's bookkeeping).
--
-- KEYS  [1] the route's string: its own controls (if any) and every tier's state (for the
--       sliding log only its controls); [2] the sliding log only: its sorted set; then, last,
--       the tenant's controls (`<prefix>:{<id>}#t`: a suspension, an override of every route,
--       a reset of every route; a caller that sends no such key has none). All share one
--       hash tag.
-- ARGV  one string, packed little-endian (struct.pack): doubles now_us (-1 = Redis server
--       TIME; -2 the same, and an admission tells its time: see Reply) and cost (0 = peek), a
--       byte naming the algorithm (its state's tag: 't' token bucket, 'g' GCRA, 'f' fixed
--       window, 'w' sliding window, 'l' sliding log), then per tier (1 to 8) doubles limit,
--       period_us, burst: '<ddB' .. n * '<ddd', 17 + 24 * n bytes.
--       Numbers are integers below 2^53 (limit, period and burst at least 1). Packed, because
--       every ARGV element and every tonumber costs Redis more than the whole unpack.
-- Split  the form a Cluster slot migration needs: Redis refuses a script on several keys of a
--       migrating slot while some exist and some do not (`TRYAGAIN Multiple keys request during
--       rehashing of slot`), and the tenant's key usually does not. On that refusal alone the
--       caller reads the other keys itself (each with a one-key MGET, an absent key as '') and
--       sends KEYS [1] the state's key only (the route's string; the sliding log's sorted set),
--       ARGV [1] as above, [2] the tenant's string, [3] the sliding log only: its controls'
--       string. They are used as if read here: controls read a moment before the decision are
--       the controls of a decision that ran just before a concurrent change to them. Nothing is
--       written to those keys in this form: the sliding log's admission skips refreshing its
--       controls (an override's idle expiry; a tenant reset's stamp: every split call then
--       counts only the units admitted since the reset, `forget`, and deletes none, for a
--       script must not empty a key of a migrating slot and touch it again; the first call in
--       the normal form after the move still applies the reset, forgetting the units admitted
--       during the move).
-- Reply one string, packed '<BBddd': flags (1 allowed, 2 suspended, 4 an override decided),
--       the binding tier's position (from 1), remaining, retry_after_ms (-1 = never), and
--       reset_after_ms (when every tier is fresh again); with flag 4, '<ddd' more: the
--       override tier's limit, period_us and burst (the caller knows its own tiers, not the
--       override's). The request is admitted only when every tier admits it, and then costs
--       every tier (all or none). The binding tier: on an admission the one with the least
--       remaining, on a denial the denying one with the longest wait. One string costs Redis
--       less than converting an array of integers. Every time is capped at MAX_REPLY_MS, so
--       no stored value makes a reply unreadable.
--       Except: an admission under the caller's one quota (one tier, no controls) replies one
--       integer, reset_after_ms * (burst + 1) + remaining, when that is below 2^53 (remaining
--       is whole, from 0 to burst; the caller knows its burst). An integer costs Redis less
--       than packing a string.
--       With now_us -2 an admission always replies the string, followed by '<d' more: the µs
--       of Redis's clock at which it decided (what a refund of its units sends as their
--       reservation's time; lua/refund.lua). A denial replies as usual.
--
-- The tenant's string (the last key), written by lua/control.lua:
--   'M', double suspended_until_us (0: not suspended), a byte n (0: no override), n * doubles
--   limit, period_us, burst (an override of every route without one of its own), then
--   optionally a double reset_us: every route's states stored before it read as fresh.
-- The route's string at KEYS[1]: optional controls, then each tier's state in order.
--   controls  'M', double suspended_until_us (0: not suspended; this route only), a byte n
--             (0: no override), then n * doubles limit, period_us, burst: the route's own
--             override, used before the tenant's and the caller's quotas; 10 + 24 * n bytes.
--             Then, once the tenant was reset, 'E' and a double: the tenant's reset_us the
--             states were written under (older states read as fresh).
--   state     a tag byte naming the algorithm and the layout version, followed by
--             little-endian doubles (17 bytes, 25 for the sliding window), or one 0 byte for a
--             tier with nothing stored yet. Anything else reads as a fresh tier.
--             A busy key's string on Redis's clock starts with controls that change nothing:
--             no override and, as the suspension's end, a negative double: -(the ms, Redis's
--             clock, at or before which the key expires), then its one state. Other writers
--             keep it only with the key's TTL (PTTL) or drop it.
-- A limiter that uses no controls and one tier reads one string (and the tenant's absent one)
-- and writes one string: the controls cost it one GET of a missing key.
--
-- A step is pure: it reads `stored` (a string holding its tier's state from byte `sat` on;
-- false when absent), `now`, `cost`, `limit`, `period`, `burst` (and `key`; the sliding log
-- also `forget`), and sets
--   ok (allowed), rem (remaining), re (retry µs, -1 = never), rs (reset µs), state
-- where state is the new state string, or nil when nothing is to be written. The driver reads
-- the string with one GET (a key of another type reads as absent: self-healing), and writes it
-- back with one `SET key state PX ttl`, the TTL being when every tier is fresh again (and at
-- least the override's idle time), only when the call admits and costs (a denial writes only a
-- step's repair of a clock that stepped back); one tier without controls on Redis's clock,
-- found alive, keeps the TTL it remembers while that is long enough, else sets one half as
-- long again (see the write). The sliding log keeps a sorted set instead, one for all tiers
-- (each tier counts its own window): its step reads it, and its state is a function that
-- writes it, called with the TTL and the call's decision for the tier with the longest period.
--
-- Lua numbers are doubles: every value stays an exact integer below 2^53 (GCRA's debt aside),
-- and every time leaves in whole milliseconds rounded up (never tell a client to come back
-- early). Redis runs the script's body on every call: the steps are spliced in rather than
-- called, and the hot path makes no closure and no table of its own.

-- Names in capitals (MAX_EXACT, CONTROLS, STATE_LEN, ...) are the numbers every script shares:
-- Rust writes each one's value in as a literal when it assembles the script (`CONSTANTS` in
-- src/store/wire/scripts.rs), so they have one source and no call pays for a local.
-- MAX_EXACT is 2^53; MAX_REPLY_MS, the longest time a reply carries (2^62 ms keeps its
-- integers inside an i64); OVERRIDE_IDLE_MS, how long an override lives after the last request
-- admitted on its key.
-- Only what every call uses is looked up here: each lookup costs every call. A step reaches
-- math (floor, ceil, min, max) where it needs it, off the hot path.
local spack, sunpack, call, rpcall = struct.pack, struct.unpack, redis.call, redis.pcall

local args, split = ARGV[1], ARGV[2] -- split: the tenant's string, in the split form
-- skey the route's string, lkey the sliding log's set, tkey (below) the tenant's: it comes
-- last, and a caller that sends none has no tenant controls.
local skey, lkey = KEYS[1], KEYS[2]
-- One tier packs 41 bytes: that usual length skips the arithmetic. (ARGV is a sequence: with
-- no ARGV[2], a missing ARGV[1] is the only way to have other than one argument.)
local len = args and #args
if not len or split and #ARGV > 3 or not skey or
    len ~= 41 and (len < 65 or len > 209 or (len - 17) % 24 ~= 0) then
  return redis.error_reply('ERR redlimit: invalid arguments; expected one key and one ' ..
    'argument packing now_us, cost, algorithm, then limit, period_us, burst per tier (1 to 8)')
end
local tiers = (len - 17) / 24
-- The header and the first tier in one unpack: one call into struct fewer on every decision.
local now, cost, alg, limit, period, burst, pos = sunpack('<ddBddd', args)
if not (cost >= 0 and cost < MAX_EXACT and cost % 1 == 0 and
    (now == -1 or now >= 0 and now < MAX_EXACT and now % 1 == 0 or now == -2)) then
  return redis.error_reply('ERR redlimit: invalid arguments; now_us and cost must be ' ..
    'integers from 0 below 2^53 (now_us -1 for the server clock)')
end
if not (limit >= 1 and limit < MAX_EXACT and limit % 1 == 0 and period >= 1 and
    period < MAX_EXACT and period % 1 == 0 and burst >= 1 and burst < MAX_EXACT and
    burst % 1 == 0) then
  return redis.error_reply('ERR redlimit: invalid arguments; limit, period_us and burst ' ..
    'must be integers from 1 below 2^53')
end
local log = alg == LOG_TAG
local tkey = lkey
if split then
  if KEYS[2] or log and #ARGV ~= 3 or not log and #ARGV ~= 2 then
    return redis.error_reply('ERR redlimit: invalid arguments; the split form takes the ' ..
      'state key alone, then the tenant string (and the sliding log controls) in ARGV')
  end
  lkey, tkey = skey, false
elseif log then
  if not lkey then
    return redis.error_reply('ERR redlimit: invalid arguments; the sliding log needs its key')
  end
  tkey = KEYS[3]
end
-- On Redis's clock the string may remember the key's expiry (see `kept` below): a PX counts
-- from that clock, not from a caller's. `timed`: an admission replies its time (see Reply).
local clocked, timed = now < 0, now == -2
if clocked then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
end

-- Read the route's string and the tenant's controls (absent unless an operator set one) with
-- two GETs under pcall: a key of another type answers WRONGTYPE and reads as absent
-- (self-healing: only an admission's write replaces it); any other error (a NOPERM) is the
-- caller's. Two GETs cost Redis less than one MGET, whose reply is a table (measured with
-- callgrind: 1.3 % of the decision).
local s, t
if split then
  -- Read by the caller ('' for absent reads as absent below).
  t = split
  if log then
    s, skey = ARGV[3], false
  else
    s = rpcall('GET', skey)
  end
elseif tkey then
  s, t = rpcall('GET', skey), rpcall('GET', tkey)
  if t and t.err then
    if string.sub(t.err, 1, 9) ~= 'WRONGTYPE' then
      return t
    end
    t = false
  end
else
  s = rpcall('GET', skey)
end
-- One tier, a string that can hold no controls (absent, one state's length, or one state after
-- the expiry it remembers: see below) and no tenant's string: the usual call, decided as
-- `plain` below without reading controls. Otherwise the controls are read, and the call is
-- `plain` when they hold no override and no reset and one state (or none) follows. (The
-- names the controls set are declared together: nil costs the usual call one instruction for
-- all of them.)
--
-- `kept`: the key's expiry (ms, Redis's clock) a busy key's string remembers before its one
-- state of this algorithm: controls with no override whose suspension's end is negative,
-- -expiry (the plain form's write below). No suspension ends before 0, so nothing else starts
-- that way; every reader of controls (a release before this one too) reads it as controls
-- that change nothing, followed by the state. The step reads the state where it begins.
local quotas, tover, reset_us, tuntil, head, rover, stamp, at, forget, kept
-- `sat`: where a step's state begins in `stored` (the string it reads).
local sat = 1
local plain = not t and tiers == 1 and not log
if plain and s then
  local len = #s
  if len ~= STATE_LEN and len ~= WIDE_STATE_LEN then
    plain = false
    if len == EXPIRY_HEAD + STATE_LEN and alg ~= WIDE_TAG or
        len == EXPIRY_HEAD + WIDE_STATE_LEN and alg == WIDE_TAG then
      local mark, until_us, n, tag = sunpack('<BdBB', s)
      if mark == EXPIRY_MARK and until_us < 0 and n == 0 and tag == alg then
        plain, kept, sat = true, -until_us, EXPIRY_HEAD + 1
      end
    end
  end
end
if not plain then
  quotas, tover, reset_us, tuntil = args, false, 0, 0
  if t then
    local n, clen
    -- @controls t -> n, clen, tuntil
    -- Suspended on every route (`tuntil`): answered below, after the route's own controls (a
    -- route suspended for longer answers with its own end).
    if clen and clen > 0 then
      if n > 0 then
        quotas, tover = t, n
      end
      -- The tenant's reset: a double after its controls (corrupt bytes, no time: none).
      if #t >= clen + 8 then
        reset_us = sunpack('<d', t, clen + 1)
        if not (reset_us >= 0 and reset_us < MAX_EXACT) then
          reset_us = 0
        end
      end
    end
  end

  -- The controls, when the string starts with them. A string of 17 or 25 bytes (one tier's
  -- state) never does, so those skip the look: controls take 10 + 24 * n bytes, followed by no
  -- state (10, 34, ...) or by states of which at least one is whole (27 bytes or more; only the
  -- write below and lua/control.lua, which keeps the states it finds, write these strings).
  -- `head`: the controls to write before the states (the route's override, and the tenant's
  -- reset its states now belong to), nil for none; `at`: where the states begin.
  rover, stamp, at = false, 0, 1
  if s then
    local len = #s
    if len ~= STATE_LEN and len ~= WIDE_STATE_LEN then
      if s.err then
        if string.sub(s.err, 1, 9) ~= 'WRONGTYPE' then
          return s
        end
        s = false
      else
        local n, clen, until_us
        -- @controls s -> n, clen, until_us, stamp, at
        if clen == 0 then
          -- No controls: the states begin at the first byte.
        elseif not clen then
          s = false
        else
          -- Suspended (this route, or its tenant): until the later end, answered below.
          if until_us > tuntil or tuntil ~= tuntil then
            tuntil = until_us
          end
          if n > 0 then
            head, rover, quotas, tover = string.sub(s, 1, clen), true, s, n
          end
        end
      end
    end
  end
  if tuntil > now then
    -- Suspended: denied until `tuntil` (the time left capped, so a stored end however far ahead
    -- still gives a readable reply), naming the first tier of the override in force (the
    -- route's, else the tenant's), if any; nothing written. Written out here rather than as a
    -- function: a function is a closure built on every call.
    local left = (tuntil - now) / 1000
    if left > MAX_REPLY_MS then
      left = MAX_REPLY_MS
    else
      local frac = left % 1
      left = left - frac
      if frac > 0 then
        left = left + 1
      end
    end
    if tover then
      return spack('<BBdddddd', 6, 1, 0, left, left, sunpack('<ddd', quotas, CONTROLS_HEAD + 1))
    end
    return spack('<BBddd', 2, 1, 0, left, left)
  end
  if tover then
    tiers = tover
    limit, period, burst, pos = sunpack('<ddd', quotas, CONTROLS_HEAD + 1)
  end
  forget = 0 -- the sliding log's split form: its units before this µs are not counted
  if reset_us > 0 then
    -- The tenant was reset: states stored before it read as fresh (the sliding log's are
    -- deleted; in the split form, which cannot write the stamp, only not counted), and what is
    -- written now carries the reset.
    if stamp < reset_us then
      if log then
        if skey then
          -- Asked first, as in the sliding log's step: a delete first would let its ZADD
          -- past maxmemory.
          local full = rpcall('ZADD', lkey, 'XX', 0, '')
          if type(full) == 'table' and string.sub(full.err, 1, 4) == 'OOM ' then
            return full
          end
          call('DEL', lkey)
        else
          forget = reset_us
        end
      elseif s then
        at = #s + 1
      end
    end
    head = (head or 'M\0\0\0\0\0\0\0\0\0') .. 'E' .. spack('<d', reset_us)
  end
  -- One tier's state alone (or none) is the one-tier path's; several states (a key that
  -- dropped a tier) are read tier by tier, so the first keeps its count.
  plain = at == 1 and not head and not tover and tiers == 1 and not log and
    (not s or #s == STATE_LEN or #s == WIDE_STATE_LEN)
end

-- Decide. All tiers must admit: on an admission the binding tier is the one with the least
-- remaining, on a denial the denying one with the longest wait. `write`: the string to store,
-- nil when nothing changed.
-- min_i and min_rem: the tier with the least remaining; deny_i, deny_rem and deny_re: the
-- denying tier with the longest wait. (The names that start as nil are declared together: one
-- instruction for all of them.)
local all_ok, max_rs, log_period = true, 0, -1
local write, min_i, min_rem, deny_i, deny_rem, deny_re, log_write
-- One tier and no controls, the usual call: the string is the tier's state and the step's
-- decision is the call's, without the loop's bookkeeping.
if plain then
  local stored = s
  local ok, rem, re, rs, state
  if false then
  -- @packed-steps
  else
    return redis.error_reply('ERR redlimit: unknown algorithm')
  end
  min_i, min_rem, write = 1, rem, state
  if rs > 0 then
    max_rs = rs
  end
  if not ok then
    deny_i, deny_rem, deny_re, all_ok = 1, rem, re, false
  end
else
  -- Several tiers, controls, or the sliding log. The string to write is built as the tiers
  -- are decided (no table per call): on an admission every tier's new state, on a denial only
  -- the repairs (a tier that would have admitted keeps its stored state: a denied request
  -- consumes from none); '\0' for a tier with nothing stored.
  local admitted, denied, admitted_changed, denied_changed = '', '', false, false
  local key = lkey
  -- A peek never writes or deletes: one at a sliding log whose key holds another type answers
  -- as a fresh log would and leaves the key alone (only an admission replaces it).
  local foreign = false
  if log and cost == 0 then
    local kind = call('TYPE', key).ok
    foreign = kind ~= 'zset' and kind ~= 'none'
  end
  for i = 1, tiers do
    -- Every tier is checked here, the first again: with an override in force the tiers come
    -- from the stored controls, not from ARGV.
    if i > 1 then
      limit, period, burst, pos = sunpack('<ddd', quotas, pos)
    end
    if not (limit >= 1 and limit < MAX_EXACT and limit % 1 == 0 and period >= 1 and
        period < MAX_EXACT and period % 1 == 0 and burst >= 1 and burst < MAX_EXACT and
        burst % 1 == 0) then
      return redis.error_reply('ERR redlimit: invalid arguments; limit, period_us and burst ' ..
        'must be integers from 1 below 2^53')
    end
    local stored = false
    if s and not log then
      local tag = string.byte(s, at)
      if tag == 0 then
        at = at + 1
      elseif tag == WIDE_TAG then
        stored, at = string.sub(s, at, at + (WIDE_STATE_LEN - 1)), at + WIDE_STATE_LEN
      elseif tag then
        stored, at = string.sub(s, at, at + (STATE_LEN - 1)), at + STATE_LEN
      end
    end
    local ok, rem, re, rs, state
    if foreign then
      ok, rem, re, rs = true, burst, 0, 0
    elseif false then
    -- @steps
    else
      return redis.error_reply('ERR redlimit: unknown algorithm')
    end
    if i == 1 or rem < min_rem then
      min_i, min_rem = i, rem
    end
    if not ok then
      if all_ok or (deny_re >= 0 and (re < 0 or re > deny_re)) then
        deny_i, deny_rem, deny_re = i, rem, re
      end
      all_ok = false
    end
    if rs > max_rs then
      max_rs = rs
    end
    if log then
      if state and period > log_period then
        log_write, log_period = state, period
      end
    else
      local old = stored or '\0'
      if state then
        admitted, admitted_changed = admitted .. state, true
        if ok then
          denied = denied .. old
        else
          denied, denied_changed = denied .. state, true
        end
      else
        admitted, denied = admitted .. old, denied .. old
      end
    end
  end
  if all_ok and admitted_changed then
    write = (head or '') .. admitted
  elseif not all_ok and denied_changed then
    write = (head or '') .. denied
  end
end

-- Times leave in whole ms rounded up. The TTL: when every tier is fresh again, at least 1 ms,
-- at most 2^53 ms (Lua writes numbers from 1e17 up as "1e+17", which PX refuses); an override
-- keeps its key for its idle time. `x - x % 1` is floor(x) (exact) and comparisons stand in for
-- min and max: a call into math costs Redis more than the arithmetic.
local reset_ms = max_rs / 1000
local frac = reset_ms % 1
reset_ms = reset_ms - frac
if frac > 0 then
  reset_ms = reset_ms + 1
end
if reset_ms > MAX_REPLY_MS then
  reset_ms = MAX_REPLY_MS
end
local ttl = reset_ms
if ttl < 1 then
  ttl = 1
elseif ttl > MAX_EXACT then
  ttl = MAX_EXACT
end

-- Write what the decision changed.
if log then
  if log_write then
    log_write(ttl, all_ok)
    if head and all_ok and cost > 0 and skey then
      -- The controls live beside the log: an override as long as its idle time, a reset's
      -- stamp as long as the log.
      if rover then
        -- TTLs as integers, as below.
        call('SET', skey, head, 'PX', string.format('%d', math.max(ttl, OVERRIDE_IDLE_MS)))
      else
        call('SET', skey, head, 'PX', string.format('%d', ttl))
      end
    end
  end
elseif write then
  if rover and ttl < OVERRIDE_IDLE_MS then
    ttl = OVERRIDE_IDLE_MS
  end
  -- On Redis's clock the plain form of a key found alive (a key that comes back) remembers
  -- its expiry before its state (see `kept`). While that is later than the key must live, and
  -- no more than half of that time and half of the quota's period past it, the write keeps the
  -- TTL (KEEPTTL): a busy key's decision costs Redis about 2 400 instructions less than when
  -- every admission set one, carrying the time included (counted by callgrind). Else it sets
  -- one half as long again as the key must live, so that a busy key moves its expiry once per
  -- half of its TTL, not on every admission: a key outlives its state's freshness by at most
  -- half of it and half of its period, never falls short of it. (The period: a window's state
  -- is fresh at the window's end, which an expiry set early in the window passes by half of
  -- what was left of it. The bound drops a time remembered under a longer quota, and corrupt
  -- bytes: NaN, infinities.) A new key gets its exact TTL and no time: a key used once pays
  -- nothing for it. (The remembered time is 1 ms earlier than `now`'s ms and the TTL: Redis
  -- counts a PX from its clock when it runs the SET, or from when the script started, which
  -- Redis 7.2 uses and which may fall in the ms before `now`'s.) Redis 5.0 has no KEEPTTL:
  -- there the write sets a TTL.
  if plain and clocked and s then
    local now_ms = now / 1000
    now_ms = now_ms - now_ms % 1
    if kept and kept > now_ms + ttl and kept <= now_ms + ttl + (ttl + period / 1000) / 2 and
        not rpcall('SET', skey, string.sub(s, 1, EXPIRY_HEAD) .. write, 'KEEPTTL').err then
      write = nil
    else
      ttl = ttl + (ttl - ttl % 2) / 2
      if ttl > MAX_EXACT then
        ttl = MAX_EXACT
      end
      write = spack('<BdB', EXPIRY_MARK, 1 - now_ms - ttl, 0) .. write
    end
  end
  -- The TTL as an integer string: Redis 7.0 formats a number with "%.17g", which costs it
  -- about 900 instructions more than this (1.6 % of the decision, counted by callgrind); some
  -- Redis 7.2 releases write an integer such as 100000000 with an exponent, which PX refuses.
  -- Lua's '%d' formats a 64-bit long, exact for every TTL (at most 2^53).
  if write then
    call('SET', skey, write, 'PX', string.format('%d', ttl))
  end
end

-- The reply names the binding tier by its position; an override's tier also by its quota (the
-- caller does not know it).
if all_ok then
  if tover then
    local reply = spack('<BBdddddd', 5, min_i, min_rem, 0, reset_ms,
      sunpack('<ddd', quotas, CONTROLS_HEAD + 1 + QUOTA_BYTES * (min_i - 1)))
    if timed then
      return reply .. spack('<d', now)
    end
    return reply
  end
  if timed then
    return spack('<BBdddd', 1, min_i, min_rem, 0, reset_ms, now)
  end
  if plain then
    -- One integer when it fits (see the header): packing the string costs Redis more than
    -- the rest of this path's arithmetic.
    local both = reset_ms * (burst + 1) + min_rem
    if both < MAX_EXACT then
      return both
    end
  end
  return spack('<BBddd', 1, min_i, min_rem, 0, reset_ms)
end
if deny_re > 0 then
  deny_re = math.min(math.ceil(deny_re / 1000), MAX_REPLY_MS)
end
if tover then
  return spack('<BBdddddd', 4, deny_i, deny_rem, deny_re, reset_ms,
    sunpack('<ddd', quotas, CONTROLS_HEAD + 1 + QUOTA_BYTES * (deny_i - 1)))
end
return spack('<BBddd', 0, deny_i, deny_rem, deny_re, reset_ms)
