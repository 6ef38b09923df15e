"""The page where a person turns their notification emails on or off (CSRF-protected form)."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from novelforge_sessions.dashboard.presenters import nav_roles
from novelforge_sessions.notify.mailer import preference_of, set_email_enabled


@login_required
@require_http_methods(["GET", "POST"])
def preferences(request: HttpRequest) -> HttpResponse:
    """Anyone logged in sees and changes their own setting, never another person's."""
    if request.method == "POST":
        set_email_enabled(request.user, request.POST.get("email_enabled") == "on")
        return HttpResponseRedirect(reverse("notifications") + "?saved=1")
    pref = preference_of(request.user)
    return render(request, "notify/preferences.html", {
        "enabled": pref.email_enabled, "address": request.user.email, "saved": request.GET.get("saved") == "1",
        "batch_minutes": settings.NOTIFY_BATCH_MINUTES, **nav_roles(request.user),
    })
