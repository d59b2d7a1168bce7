"""The benchmarks page's account of the test suite's time names choices of the tests: held here.

The two workers of ``scripts/test`` are held in ``test_readme_notes.py``, what the tests' flush
leaves in ``test_test_backend.py``.
"""

import inspect

from django.conf import settings

from tests.admin import test_admin_plans


def test_the_tests_flush_through_their_own_backend():
    assert settings.DATABASES["default"]["ENGINE"] == "tests.backend"


def test_the_tests_hash_passwords_with_md5():
    assert settings.PASSWORD_HASHERS == ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_the_admin_plans_history_is_committed_once_per_module_and_analyzed_in_each_test():
    source = inspect.getsource(test_admin_plans)
    assert '@pytest.fixture(scope="module")\ndef committed_history(' in source
    assert '@pytest.fixture\ndef history(committed_history, db):\n    """' in source
    assert "    analyze()\n    return committed_history" in source
