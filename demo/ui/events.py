"""How the page's events queue, named once for every feature (demo/service/hosting.py reads the
handlers' function names, so those stay as they are).

- ENGINE: everything that touches the models, one at a time (a chat reply, /generate, a benchmark,
  a preset load), so that two generations never share the target's KV cache.
- TURNS: the first half of a chat exchange (check the request, show the user's turn), which touches
  no model: outside the engine's queue, so it answers however busy the engine is.
- PLAYBACK: replays and races, which read a recorded trace only: outside the engine's queue,
  several at once.
"""

ENGINE = "engine"
PLAYBACK = "playback"
PLAYBACK_CONCURRENCY = 8
TURNS = "turns"
TURNS_CONCURRENCY = 8
PRIVATE = dict(api_visibility="private")  # every page event: only /generate is an API
# A streamed reply refreshes the text at most this often and the charts at most every
# FIGURE_INTERVAL_S: each refresh redraws the page, and a slow browser queues refreshes it cannot
# draw in time (GPU steps take milliseconds); docs/PERFORMANCE.md, "The page".
TEXT_INTERVAL_S = 1 / 10
FIGURE_INTERVAL_S = 0.5
