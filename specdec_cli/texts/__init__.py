"""Text that specdec reads and keeps: corpora for an index, prompts and prompt suites, data rows of token ids,
the answer memory, and the tokenizer fingerprint that ties them to one tokenizer.

No model runs here (a tokenizer does); loading targets lives in target/.
"""
