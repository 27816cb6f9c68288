"""zfbench's shared vocabulary: the strategy names, the config (and its builder and
ZenFlow scenario), model shapes, hardware presets, the bytes per element and per
parameter, spans and timelines, ZenFlow's schedule arithmetic and the provenance every
result records.

Everything else in zfbench imports from here; nothing here imports anything else of
zfbench (tests/test_layering.py holds it to that)."""
