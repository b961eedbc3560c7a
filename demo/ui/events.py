"""How the page's events queue: each feature registers its events with a role tag of
demo/service/roles.py (ENGINE, TURNS, PLAYBACK, or outside the queue), which says what each means and
by which the public gate counts a client's events; and how often a stream redraws the page."""

from demo.service.roles import ENGINE, PLAYBACK, TURNS

__all__ = ["ENGINE", "PLAYBACK", "TURNS", "PLAYBACK_CONCURRENCY", "TURNS_CONCURRENCY", "PRIVATE", "TEXT_INTERVAL_S",
           "FIGURE_INTERVAL_S"]

PLAYBACK_CONCURRENCY = 8
TURNS_CONCURRENCY = 8
PRIVATE = dict(api_visibility="private")  # every page event: only /generate is an API
# A streamed reply refreshes the text at most this often and the charts at most every
# FIGURE_INTERVAL_S: each refresh redraws the page, and a slow browser queues refreshes it cannot
# draw in time (GPU steps take milliseconds); docs/PERFORMANCE.md, "The page".
TEXT_INTERVAL_S = 1 / 10
FIGURE_INTERVAL_S = 0.5
