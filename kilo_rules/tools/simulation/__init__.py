"""Replaying recorded sessions under policies: one session (simulate), a corpus (fleet),
the search for the cheapest safe knobs (tune) and the HTML report."""
