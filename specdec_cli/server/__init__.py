"""`specdec serve` on specdec's own engine: an OpenAI-compatible HTTP server (starlette on uvicorn) in front of one
chat session (session/chat.py: the target, the engine, the drafter, the prompt cache).

One concept a file: settings.py (what a server is made from, checked before the model loads), api_errors.py (the
OpenAI error body), requests.py (request bodies read and checked into `CompletionRequest`; body_fields.py, its
scalar readers; shaping_fields.py, the bias, penalties and DRY), responses_api.py (OpenAI's Responses API read as a
chat request, its response and events), unhonoured.py (fields refused by name), tools.py (a request's tools),
answer_stream.py (what a request is sent of its answer: text as texts/text_stream.py shows it, tool calls),
logprob_stream.py, step_trace.py (each step's drafts, for the chat page), responses.py (the JSON of a response and
of a stream's chunks, `usage` and `timings`), metrics.py, page.py (the chat page's files, webui/), llama_api.py
(llama.cpp's `/completion` and `/props`, which `specdec bench --reference URL` reads), worker.py (the one thread
that generates: requests one at a time in arrival order from a bounded queue), app.py (the routes, the key, the body
limit) and run.py (load the model, start uvicorn). Nothing here prints: the CLI (cli/serve_cmd.py) renders what
`run.serve` reports.
"""
