-- wrk script of the zarrgate load test. load/run.sh starts one wrk per kind of request, all at
-- once, with its share of the connections:
--   raw             raw store keys (chunks, metadata, probes of missing keys)
--   ranged          raw chunk keys with a Range header (prefix, suffix, open, unsatisfiable)
--   slice_cached    slices of the demo and fixture arrays (their chunks stay in the cache)
--   slice_uncached  32 x 32 slices of random regions of a 1 GiB array (4x the cache: most miss)
--   zom             ZOM documents, mounts and listings
-- Status codes are counted per code and printed by done() as one JSON line (LOAD_RESULT).
--   wrk -t1 -cN -d60s -s load/mix.lua http://127.0.0.1:PORT -- DIR KIND

local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  threads[#threads + 1] = thread
end

local function read_lines(path)
  local out = {}
  for line in io.lines(path) do
    if #line > 0 then out[#out + 1] = line end
  end
  return out
end

local RANGES = {"bytes=0-99", "bytes=-16", "bytes=10-", "bytes=0-0", "bytes=100000000-"}
local list, shape, chunk

function init(args)
  local dir = args[1]
  kind = args[2]
  if kind == "slice_uncached" then
    for line in io.lines(dir .. "/uncached.txt") do
      local s, c = line:match("(%d+) (%d+)")
      shape, chunk = tonumber(s), tonumber(c)
    end
  else
    local file = ({raw = "raw", ranged = "ranged", slice_cached = "slices", zom = "zom"})[kind]
    list = read_lines(dir .. "/" .. file .. ".txt")
  end
  math.randomseed(os.time() + 7919 * id)
  counts = {}  -- status -> n; a global, so that done() can read it with thread:get
end

function request()
  if kind == "slice_uncached" then
    local n = shape / chunk
    local ci, cj = math.random(0, n - 1), math.random(0, n - 1)
    local y = ci * chunk + math.random(0, chunk - 32)
    local x = cj * chunk + math.random(0, chunk - 32)
    local fmt = (math.random(4) == 1) and "bin" or "json"
    return wrk.format("GET", string.format("/api/v1/slice/big/array?select=%d:%d,%d:%d&format=%s",
      y, y + 32, x, x + 32, fmt))
  end
  local headers = {}
  if kind == "ranged" then headers["Range"] = RANGES[math.random(#RANGES)] end
  return wrk.format("GET", list[math.random(#list)], headers)
end

function response(status, hdrs, body)
  local key = tostring(status)
  counts[key] = (counts[key] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("counts")) do total[k] = (total[k] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(total) do parts[#parts + 1] = string.format('"%s": %d', k, v) end
  table.sort(parts)
  local e = summary.errors
  io.write(string.format('LOAD_RESULT {"kind": "%s", "requests": %d, "duration_us": %d, "bytes": %d, ',
    threads[1]:get("kind"), summary.requests, summary.duration, summary.bytes))
  io.write(string.format('"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ',
    e.connect, e.read, e.write, e.status, e.timeout))
  io.write(string.format('"latency_us": {"mean": %.0f, "p50": %d, "p90": %d, "p99": %d, "max": %d}, ',
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
  io.write('"status": {' .. table.concat(parts, ", ") .. "}}\n")
end
