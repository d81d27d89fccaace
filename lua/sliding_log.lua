-- Sliding window log: exact. The key is a sorted set with one member per admitted unit, scored
-- with the µs time it was admitted; members are "<µs score>:<n>", unique (only scores matter).
-- A unit counts during [s, s + period) for its score s. A request of cost k is allowed when the
-- units in the window (now - period, now] plus k are at most burst.
-- Memory and time are O(burst) per key: one sorted-set entry per admitted unit (a request of
-- cost k adds k members). Keep burst small, or choose another algorithm.
-- This step reads its own sorted set (the driver's GET sees no string there); its new state is
-- a function that writes it, called by the driver with the TTL.
  -- 1. Read the newest entry: a key of another type is deleted and counts as empty.
  local newest = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest.err then
    -- Under maxmemory Redis refuses only a script's first write that may add memory: this
    -- delete first would let the admission's ZADD past it. A ZADD that changes nothing asks
    -- first (OOM exactly when the admission's would be; WRONGTYPE otherwise).
    local full = rpcall('ZADD', key, 'XX', 0, '')
    if type(full) == 'table' and string.sub(full.err, 1, 4) == 'OOM ' then
      return full
    end
    call('DEL', key)
    newest = {}
  end
  local newest_t = tonumber(newest[2])

  -- 2. Cap to the clock. A newest entry ahead of now by at most MAX_SKEW µs (`Clock::MAX_SKEW`,
  --    src/clock.rs) is another instance's clock running ahead of this one (skew): the step
  --    decides as of that entry (`t`): it counts the window that ends there and adds its units
  --    there, never before the newest (that would shorten their stay in the window), and its
  --    times still count from this caller's now. Further ahead, this clock stepped back: entries
  --    from the future count as admitted now, and a request that costs something writes that
  --    down even when denied, or those entries would stay in the window until the clock caught
  --    up with them.
  local MAX_SKEW, t = 5000000, now
  local stepped_back = newest_t ~= nil and newest_t - now > MAX_SKEW
  if stepped_back then
    newest_t = now
  elseif newest_t ~= nil and newest_t > now then
    t = newest_t
  end
  local from = t - period + 1 -- the oldest µs inside the window
  -- The oldest µs counted: the window's, or in the driver's split form after a tenant reset
  -- the reset's (`forget`, 0 otherwise: lua/common.lua), whose older units are not counted
  -- though they stay (deleting them could leave a migrating slot without the key).
  local counted = from
  if counted < forget then
    counted = forget
  end

  -- 3. Count the units in the window.
  local count = 0
  if newest_t ~= nil and newest_t >= counted then
    count = call('ZCOUNT', key, counted, '+inf')
  end

  -- 4. Decide (a peek always passes, even over a tightened quota). A denied request consumes
  --    nothing.
  local allowed = cost == 0 or count + cost <= burst
  local used, retry = count, 0
  if allowed then
    used = count + cost
  elseif cost > burst then
    retry = -1
  else
    -- 5a. Retry: when the (count + cost - burst)-th oldest unit in the window leaves it.
    local oldest = call('ZRANGEBYSCORE', key, counted, '+inf', 'WITHSCORES', 'LIMIT',
      count + cost - burst - 1, 1)
    retry = math.min(tonumber(oldest[2]), t) + period - now
  end

  -- 5b. Reset: when the newest unit leaves the window.
  local reset = 0
  if allowed and cost > 0 then
    reset = t + period - now
  elseif count > 0 then
    reset = newest_t + period - now
  end

  -- 6. The write: move entries from the future to now, drop the units that left the window,
  --    add one member per unit (NX, and more if a name was taken), expire when the newest
  --    unit leaves the window.
  ok, rem, re, rs = allowed, math.max(0, burst - used), retry, reset
  if cost > 0 and (allowed or stepped_back) then
    state = function(ttl, admit)
      if not (admit or stepped_back) then
        return
      end
      if stepped_back then
        local future = call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now), '+inf')
        for i = 1, #future do
          call('ZADD', key, 'XX', now, future[i])
        end
      end
      if admit then
        -- The members first, then the units that left the window: under maxmemory Redis
        -- refuses only a script's first write that may add memory, and a removal first would
        -- let the ZADD past it.
        local prefix = string.format('%d:', t)
        local n, added = count, 0
        if cost == 1 then
          -- The usual case, without building a table of members.
          n, added = n + 1, call('ZADD', key, 'NX', t, prefix .. (n + 1))
        end
        while added < cost do
          local members = {}
          for _ = 1, math.min(cost - added, 1000) do
            n = n + 1
            members[#members + 1] = t
            members[#members + 1] = prefix .. n
          end
          added = added + call('ZADD', key, 'NX', unpack(members))
        end
        call('ZREMRANGEBYSCORE', key, '-inf', from - 1)
      end
      call('PEXPIRE', key, ttl)
    end
  end
