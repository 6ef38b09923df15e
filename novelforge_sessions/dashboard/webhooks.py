"""The manager's webhook pages (docs/webhooks.md#the-managers-page): register an endpoint (its
secret shown once), rotate the secret, see each endpoint's recent attempts, redeliver one.

The same writes as the API (``webhooks.endpoints``); a project the user does not manage is 404.
Every form is POST with CSRF. A page that shows a secret is the POST's own answer (never a
redirect, never stored in the session): reloading it does not show the secret again.
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods, require_POST

from novelforge_sessions import access
from novelforge_sessions.dashboard.presenters import error_words, nav_roles
from novelforge_sessions.errors import ServiceError
from novelforge_sessions.event_types import CATALOG
from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.models import Project
from novelforge_sessions.webhooks import endpoints as hooks
from novelforge_sessions.webhooks.models import MAX_DESCRIPTION, MAX_URL, WebhookEndpoint

#: Deliveries shown with an endpoint (newest first), as the API's detail.
RECENT_DELIVERIES = 20


def _project(request: HttpRequest, project_id: int) -> Project:
    try:
        return access.caller_for_user(request.user).projects().get(id=project_id)
    except Project.DoesNotExist:
        raise Http404("project not found") from None


def _endpoint(project: Project, endpoint_id: int) -> WebhookEndpoint:
    try:
        return hooks.get_endpoint([project.id], endpoint_id)
    except ServiceError:
        raise Http404("webhook endpoint not found") from None


#: The named notices (``webhooks.endpoints.NAMED_KINDS``) as the form says them, in the page's language.
KIND_WORDS = {
    "gate opened": gettext_lazy("gate opened"),
    "verdict bound": gettext_lazy("verdict bound"),
    "approval requested": gettext_lazy("approval requested"),
    "session failed": gettext_lazy("session failed"),
    "conflict opened": gettext_lazy("conflict opened"),
    "handoff waiting too long": gettext_lazy("handoff waiting too long"),
}


def _kinds() -> list[dict]:
    """The form's event types: the named notices first (in words), then every catalog type (its code)."""
    named = [{"value": t, "label": str(KIND_WORDS.get(k, k))} for k, t in hooks.NAMED_KINDS.items()]
    shown = {t for t in hooks.NAMED_KINDS.values()}
    return named + [{"value": t, "label": t} for t in sorted(CATALOG) if t not in shown]


def _list_context(request: HttpRequest, project: Project, **extra) -> dict:
    return {
        "project": project, "endpoints": list(hooks.endpoints_of([project.id]).order_by("id")),
        "kinds": _kinds(), "max_url": MAX_URL, "max_description": MAX_DESCRIPTION, **nav_roles(request.user), **extra,
    }


@login_required
@require_http_methods(["GET", "POST"])
def endpoints(request: HttpRequest, project_id: int) -> HttpResponse:
    """The project's endpoints and the registration form; a registration answers with its secret."""
    project = _project(request, project_id)
    if request.method == "GET":
        return render(request, "dashboard/webhooks.html", _list_context(request, project))
    url = (request.POST.get("url") or "").strip()
    types = request.POST.getlist("event_types")
    if request.POST.get("any_event") == "on":
        types = [hooks.ANY_EVENT]
    description = (request.POST.get("description") or "").strip()[:MAX_DESCRIPTION]
    try:
        endpoint, secret = hooks.create_endpoint(project, url=url, event_types=types, description=description,
                                                 actor=f"user:{request.user.get_username()}")
    except ServiceError as exc:
        context = _list_context(request, project, error=error_words(exc.code, exc.message), form={"url": url, "types": set(types),
                                                                         "description": description})
        return render(request, "dashboard/webhooks.html", context, status=422)
    return render(request, "dashboard/webhook_secret.html", {
        "project": project, "endpoint": endpoint, "secret": secret, "created": True, **nav_roles(request.user),
    }, status=201)


@login_required
@require_http_methods(["GET"])
def endpoint_detail(request: HttpRequest, project_id: int, endpoint_id: int) -> HttpResponse:
    project = _project(request, project_id)
    endpoint = _endpoint(project, endpoint_id)
    deliveries = list(endpoint.deliveries.order_by("-id")[:RECENT_DELIVERIES])
    return render(request, "dashboard/webhook.html", {
        "project": project, "endpoint": endpoint, "deliveries": deliveries, "pending": DeliveryState.PENDING.value,
        **nav_roles(request.user),
    })


@login_required
@require_POST
def rotate(request: HttpRequest, project_id: int, endpoint_id: int) -> HttpResponse:
    project = _project(request, project_id)
    _endpoint(project, endpoint_id)
    endpoint, secret = hooks.rotate_secret([project.id], endpoint_id)
    return render(request, "dashboard/webhook_secret.html", {
        "project": project, "endpoint": endpoint, "secret": secret, "created": False, **nav_roles(request.user),
    })


@login_required
@require_POST
def set_active(request: HttpRequest, project_id: int, endpoint_id: int) -> HttpResponse:
    project = _project(request, project_id)
    _endpoint(project, endpoint_id)
    active = request.POST.get("active") == "on"
    hooks.set_active([project.id], endpoint_id, active)
    messages.success(request, _("The endpoint is active: new events are sent to it.") if active
                     else _("The endpoint is paused: events while it is paused are not sent later."))
    return redirect(reverse("dashboard:webhook", args=[project.id, endpoint_id]))


@login_required
@require_POST
def redeliver(request: HttpRequest, project_id: int, endpoint_id: int, delivery_id: int) -> HttpResponse:
    project = _project(request, project_id)
    _endpoint(project, endpoint_id)
    try:
        delivery = hooks.redeliver([project.id], endpoint_id, delivery_id)
    except ServiceError as exc:
        if exc.code == "not_found":
            raise Http404("webhook delivery not found") from None
        messages.error(request, f"{error_words(exc.code, exc.message)} ({exc.code})")
    else:
        messages.success(request, _("Delivery %(id)s is sent again with the same webhook-id (%(wid)s).")
                         % {"id": delivery.id, "wid": delivery.webhook_id})
    return redirect(reverse("dashboard:webhook", args=[project.id, endpoint_id]) + "#deliveries")
