"""The floor of the API goals: a bare django-ninja endpoint that makes one INSERT (bench only)."""
