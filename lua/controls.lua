-- redlimit: the controls at the start of a key's string, read: the one reading of their layout
-- (lua/common.lua's header) in every script. Rust splices it in as code, not as a function (a
-- function is a closure built on every call), at each line
--   -- @controls <string> -> <n>, <len>, <until_us>[, <stamp>, <at>]
-- with the names the line gives put for `s`, `n`, `len`, `until_us`, `stamp` and `at` below;
-- the script declares them. It sets
--   len       the controls' length: 0 when the string does not start with controls (a state
--             begins at its first byte), false when it starts like controls but is cut short
--             (the whole string reads as absent)
-- and, meaningful only when len > 0 (a string without controls leaves them as the script set
-- them: it costs one look at its first byte):
--   n         the override's tier count (0: none)
--   until_us  the suspension's end in µs (0: none)
-- and, with five names (a route's string, whose states may follow a reset's stamp), the part
-- between `@stamp` and `@end`:
--   stamp     the tenant's reset the states were written under ('E' and a double; 0 when
--             it is no time from 0 to MAX_EXACT: corrupt bytes read as no stamp)
--   at        where the states begin
-- A string of one tier's state (STATE_LEN or WIDE_STATE_LEN bytes) never starts with
-- controls: a script reading a route's string leaves those lengths out before this.
len = 0
if string.byte(s, 1) == CONTROLS then
  n = string.byte(s, CONTROLS_HEAD)
  len = n and n <= MAX_TIERS and CONTROLS_HEAD + QUOTA_BYTES * n or false
  if len and #s >= len then
    until_us = sunpack('<d', s, 2)
    -- @stamp
    at = len + 1
    if string.byte(s, at) == STAMP and #s >= at + 8 then
      stamp, at = sunpack('<d', s, at + 1), at + 9
      -- Bytes that are no time (corrupt): no stamp, as a missing one.
      if not (stamp >= 0 and stamp < MAX_EXACT) then
        stamp = 0
      end
    end
    -- @end
  else
    len = false
  end
end
