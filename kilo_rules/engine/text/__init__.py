"""How text is counted and cut: token counters (Kilo's estimate and tiktoken encodings
shipped offline) and tool-output truncation."""
