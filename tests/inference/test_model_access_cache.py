"""The served-model cache of the completion endpoints: reloaded ahead, never older than its TTL."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from common.errors import NotFound
from inference.api import model_access
from inference.models import ServedModel

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def model(served_model, monkeypatch):
    monkeypatch.setattr(model_access, "CACHE_TTL_S", 5.0)
    monkeypatch.setattr(model_access, "REFRESH_AFTER_S", 0.2)
    model_access.model_cache_clear()
    try:
        yield served_model
    finally:
        for task in list(model_access._reloads.values()):
            await task
        model_access.model_cache_clear()
        await sync_to_async(connections.close_all)()


async def _disable(name: str) -> None:
    await sync_to_async(ServedModel.objects.filter(name=name).update)(enabled=False)


async def test_a_model_in_use_is_reloaded_in_the_background(model):
    info = await model_access.amodel_info_get(name=model.name)
    await _disable(model.name)  # elsewhere: no clear in this process
    assert await model_access.amodel_info_get(name=model.name) is info  # young: cached, nothing reloaded
    assert not model_access._reloads
    await asyncio.sleep(0.25)
    assert await model_access.amodel_info_get(name=model.name) is info  # older: still answered at once...
    reload = model_access._reloads[model.name]  # ...and one reload started
    assert await model_access.amodel_info_get(name=model.name) is info
    assert model_access._reloads[model.name] is reload  # one at a time
    await reload
    assert model.name not in model_access._reloads
    with pytest.raises(NotFound):  # the reload saw the disabled row
        await model_access.amodel_info_get(name=model.name)


async def test_past_its_ttl_a_row_is_read_on_the_request_path(model, monkeypatch):
    monkeypatch.setattr(model_access, "CACHE_TTL_S", 0.1)
    monkeypatch.setattr(model_access, "REFRESH_AFTER_S", 10.0)
    await model_access.amodel_info_get(name=model.name)
    await _disable(model.name)
    await asyncio.sleep(0.15)
    with pytest.raises(NotFound):
        await model_access.amodel_info_get(name=model.name)
    assert not model_access._reloads


async def test_a_reload_that_raced_a_clear_is_not_cached(model):
    await model_access.amodel_info_get(name=model.name)
    reload = asyncio.get_running_loop().create_task(model_access._load(model.name))
    await asyncio.sleep(0)  # the reload has begun its query
    model_access.model_cache_clear()
    await reload
    assert model.name not in model_access._cache


async def test_unknown_names_are_cached_but_never_reloaded_ahead(model):
    for _ in range(2):
        with pytest.raises(NotFound):
            await model_access.amodel_info_get(name="no-such-model")
    await asyncio.sleep(0.25)
    with pytest.raises(NotFound):
        await model_access.amodel_info_get(name="no-such-model")
    assert not model_access._reloads
