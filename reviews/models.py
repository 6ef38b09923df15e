"""Review gates, blind packets and verdicts live here (see the review issue)."""
