"""Reviewer pages (``/reviews/…``) and the managers' calibration view."""
from django.urls import path

from reviews import views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("packets/<int:packet_id>/", views.packet_page, name="packet"),
    path("packets/<int:packet_id>/relay/", views.relay_paste, name="relay"),
    path("packets/<int:packet_id>/relay.txt", views.relay_export, name="relay-export"),
    path("calibration/", views.calibration, name="calibration"),
    path("gates/", views.gates, name="gates"),
]
