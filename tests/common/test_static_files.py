"""common.static_files: DEBUG's static handler refuses a path out of the static directories before any finder runs."""

import pytest

from common.static_files import static_path_is_safe


@pytest.mark.parametrize("relative", ["../.env", "admin/../../manage.py", "..", "./admin/css/base.css",
                                      "admin\\..\\..\\.env", "a\x00b", "admin/./css/base.css"])
def test_climbing_or_odd_paths_are_refused(relative):
    assert not static_path_is_safe(relative)


@pytest.mark.parametrize("relative", ["admin/css/base.css", "admin/js/vendor/jquery/jquery.min.js", "a..b/c.css",
                                      "dashboard/app..min.js"])
def test_paths_inside_are_served(relative):
    assert static_path_is_safe(relative)
