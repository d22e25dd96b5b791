from django.urls import path

from computers import api

urlpatterns = [
    path("computers", api.ComputerListView.as_view(), name="api-computers"),
    path("computers/<int:pk>", api.ComputerDetailView.as_view(), name="api-computer"),
    path("computers/<int:pk>/checks", api.CheckListView.as_view(), name="api-computer-checks"),
    path("computers/<int:pk>/checks/<int:check_id>", api.CheckDetailView.as_view(), name="api-computer-check"),
    path("computers/<int:pk>/reads", api.ReadListView.as_view(), name="api-computer-reads"),
    path("computers/<int:pk>/reads/<int:read_id>", api.ReadDetailView.as_view(), name="api-computer-read"),
]
