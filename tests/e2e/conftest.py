"""Hypothesis profiles of the end-to-end property tests (test-only configuration).

Registered here, before pytest's hypothesis plugin loads the one `--hypothesis-profile` names:
`programs-500` runs test_random_programs.py at the 500 examples of its acceptance.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("programs-500", max_examples=500, deadline=None)
