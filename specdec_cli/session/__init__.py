"""A target, a drafter and an engine put together for people: a conversation (prompt formatting, history, one
answer per turn) and the plain-against-speculative comparison. Commands and benchmarks build on these.
"""
