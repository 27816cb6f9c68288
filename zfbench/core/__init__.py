"""zfbench's shared vocabulary: the config, model shapes, hardware presets, spans and
timelines, ZenFlow's schedule arithmetic and the provenance every result records.

Everything else in zfbench imports from here; nothing here imports anything else of
zfbench (tests/test_layering.py holds it to that)."""
