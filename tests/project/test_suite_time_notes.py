"""The benchmarks page's account of the test suite's time names two choices of the tests: held here."""

import inspect

from django.conf import settings

from tests.admin import test_admin_plans


def test_the_tests_hash_passwords_with_md5():
    assert settings.PASSWORD_HASHERS == ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_the_admin_plans_history_is_committed_once_per_module_and_analyzed_in_each_test():
    source = inspect.getsource(test_admin_plans)
    assert '@pytest.fixture(scope="module")\ndef committed_history(' in source
    assert '@pytest.fixture\ndef history(committed_history, db):\n    """' in source
    assert "    analyze()\n    return committed_history" in source
