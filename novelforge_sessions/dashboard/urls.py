"""Manager pages, their partials, and the manager actions (all POST, CSRF-protected)."""
from django.urls import path

from novelforge_sessions.dashboard import views, webhooks

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("counts/", views.counts, name="counts"),
    path("charts/", views.overview_charts, name="charts"),
    path("sessions/<int:session_id>/", views.session_detail, name="session"),
    path("sessions/<int:session_id>/row/", views.session_row, name="session-row"),
    path("sessions/<int:session_id>/panels/", views.session_panels, name="session-panels"),
    path("sessions/<int:session_id>/close/", views.close_session, name="close"),
    path("sessions/<int:session_id>/abort/", views.abort_session, name="abort"),
    path("sessions/<int:session_id>/terminate/", views.terminate_session, name="terminate"),
    path("sessions/<int:session_id>/handoffs/<int:handoff_id>/resolve-conflict/", views.resolve_conflict,
         name="resolve-conflict"),
    path("sessions/<int:session_id>/resume/", views.resume, name="resume"),
    path("projects/<int:project_id>/", views.project_detail, name="project"),
    path("projects/<int:project_id>/intents/<int:intent_id>/approve/", views.approve_intent, name="intent-approve"),
    path("projects/<int:project_id>/intents/<int:intent_id>/refuse/", views.refuse_intent, name="intent-refuse"),
    path("projects/<int:project_id>/webhooks/", webhooks.endpoints, name="webhooks"),
    path("projects/<int:project_id>/webhooks/<int:endpoint_id>/", webhooks.endpoint_detail, name="webhook"),
    path("projects/<int:project_id>/webhooks/<int:endpoint_id>/rotate/", webhooks.rotate, name="webhook-rotate"),
    path("projects/<int:project_id>/webhooks/<int:endpoint_id>/active/", webhooks.set_active, name="webhook-active"),
    path("projects/<int:project_id>/webhooks/<int:endpoint_id>/deliveries/<int:delivery_id>/redeliver/",
         webhooks.redeliver, name="webhook-redeliver"),
]
