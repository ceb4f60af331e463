"""The console's shared template context, for every page of every app (a context processor,
settings.TEMPLATES): the apps' views pass only their own data."""

from django.utils.functional import SimpleLazyObject

from pools.actors import Actor


def console(request) -> dict:
    # lazy: only a page that shows the operator's links asks for the user's roles
    return {"is_operator": SimpleLazyObject(lambda: Actor.from_request(request).is_operator)}
