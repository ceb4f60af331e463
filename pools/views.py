"""Console pages for a person's own API tokens."""

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from . import selectors, services
from .actors import Actor
from .forms import ApiTokenForm


@login_required
def tokens_page(request):
    secret = None
    form = ApiTokenForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            _, secret = services.api_token_issue(
                user=request.user,
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                ttl=timedelta(days=form.cleaned_data["ttl_days"]),
            )
            form = ApiTokenForm(user=request.user)
        except ValidationError as exc:  # the service's rules, shown on the form's fields
            form.add_error(None, exc)
    context = {
        "form": form,
        "secret": secret,
        "tokens": selectors.tokens_visible_to(Actor.from_request(request)),
    }
    return render(request, "console/tokens.html", context)


@login_required
@require_POST
def token_revoke(request, pk):
    token = get_object_or_404(selectors.tokens_visible_to(Actor.from_request(request)), pk=pk)
    services.api_token_revoke(token=token)
    return render(request, "console/_token_row.html", {"token": token})
