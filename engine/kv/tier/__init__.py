"""The second KV tier: blocks (and linear-attention states) kept outside the pool and loaded back.

store.py (the entries, their checksums and cap), file_io.py (the bytes on disk or in host memory,
the model fingerprint), policy.py (when a write-back or a swap pays), setup.py (built from
values), link.py (the manager's one door to it), state_entries.py (states beside their blocks).
"""
