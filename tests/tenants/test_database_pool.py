"""PostgreSQL connections come from psycopg's pool (settings: DB_POOL), not one new connection per request."""

import pytest
from django.db import connection

from tenants.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)


def test_postgresql_connections_are_pooled_and_reused():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: `make test-postgres` runs it")
    assert connection.settings_dict["CONN_MAX_AGE"] == 0  # Django refuses a pool beside persistent connections
    list(ApiKey.objects.all()[:1])
    assert connection.pool is not None
    raw = connection.connection
    assert raw.info.dbname.startswith("test_")  # the pool was made for the test database
    opened = connection.pool.get_stats().get("connections_num", 0)
    for _ in range(3):
        connection.close()  # what request_finished does: the connection goes back to the pool...
        assert connection.connection is None
        list(ApiKey.objects.all()[:1])  # ...and the next query takes one from it...
        assert connection.connection.info.dbname == raw.info.dbname
    assert connection.pool.get_stats().get("connections_num", 0) == opened  # ...none opened meanwhile
