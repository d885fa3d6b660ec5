-- wrk script for bench/run.sh: GETs the paths listed in the file named by $WRK_KEYS
-- (one per line) round-robin, each thread starting at a different place (a list of one path is
-- sent as wrk's static request), and prints one line
--   RESULT <requests/s> <p50 us> <p99 us> <errors> <bytes>
-- at the end. Non-2xx/3xx answers count as errors. With $WRK_PACE_MS set, each connection waits
-- that many milliseconds after a response before its next request (wrk's delay(), whole
-- milliseconds): a load below saturation, where latency is not just the queue of a closed loop.

local keys = {}
for line in io.lines(os.getenv("WRK_KEYS")) do
    if #line > 0 then keys[#keys + 1] = line end
end

local counter = 0
local threads = {}

function setup(thread)
    thread:set("offset", counter * 7919)
    counter = counter + 1
end

local pace = tonumber(os.getenv("WRK_PACE_MS") or "")
if pace then
    function delay() return pace end
end

-- One path: wrk's static request, formatted once a thread from wrk.path, as plain
-- `wrk URL` sends it. A request() function is a call into Lua for every request, 1.5-2.2 us
-- more of wrk's CPU a request (against zarrgate, nginx and the hyper floor alike, 2026-12-01:
-- bench/JOURNAL.md) on the cores the server under test shares: it is only for key lists.
if #keys == 1 then
    wrk.path = keys[1]
else
    local i = 0
    function request()
        i = i + 1
        return wrk.format("GET", keys[((i + (offset or 0)) % #keys) + 1])
    end
end

function done(summary, latency, requests)
    local e = summary.errors
    local errors = e.connect + e.read + e.write + e.status + e.timeout
    io.write(string.format("RESULT %.1f %.1f %.1f %d %d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99), errors, summary.bytes))
end
