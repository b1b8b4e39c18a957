"""A target, a drafter and an engine put together for people: one run's settings (run_settings.py: the load, the
drafter, generation, composed and checked once, shared by chat, bench, serve and the vLLM proposers), a conversation
(prompt formatting, history, one answer per turn) and the plain-against-speculative comparison. Commands and
benchmarks build on these.
"""
