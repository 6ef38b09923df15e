"""Review panels embedded in manager pages (filled in by the review feature)."""
from django import template

register = template.Library()


@register.inclusion_tag("reviews/_session_panel.html")
def review_panel(session):
    """The review gates of one session, for the manager's session page."""
    return {"session": session, "gates": []}
