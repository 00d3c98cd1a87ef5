import json

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .models import Order


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body)
    order = Order.objects.create(item=data["item"], quantity=data["quantity"])
    return JsonResponse({"id": order.pk, "item": order.item}, status=201)


@require_GET
def order(request: HttpRequest, pk: int) -> JsonResponse:
    found = get_object_or_404(Order, pk=pk)
    return JsonResponse({"id": found.pk, "item": found.item, "quantity": found.quantity})
