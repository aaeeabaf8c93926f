"""The dashboard owns no tables; this model only carries the operator console's permissions."""

from django.db import models


class Console(models.Model):
    """No table (unmanaged): the content type that `dashboard.view_revenue` hangs on.

    The console shows the fleet, queues and errors to every staff user; revenue and the top tenants by spend
    only to users with `dashboard.view_revenue` (superusers have every permission). Grant it in the admin
    (a user's or a group's permissions).
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_revenue", "Can see revenue and the top tenants by spend in the operator console")]
