"""The research example: a planner, five parallel researchers (one fails), a quorum, a writer."""
