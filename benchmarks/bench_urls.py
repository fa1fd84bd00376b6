"""project.urls plus `/bench/trivial`: a view that reads the body and answers a small JSON object,
through the same middleware as every other view; and the same view at `/webhooks/bench-trivial`,
on the webhook intakes' lean middleware stack (crm/wsgi.py)."""

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from project.urls import urlpatterns as project_urls


@csrf_exempt
def trivial(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True, "bytes": len(request.body)})


urlpatterns = [
    path("bench/trivial", trivial),
    path("webhooks/bench-trivial", trivial),  # an intake path: crm/wsgi.py's lean middleware stack
    *project_urls,
]
