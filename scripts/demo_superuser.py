"""Create the demo superuser that ``make demo`` prints (admin / admin); safe to run again.

An existing ``admin`` user is made an active superuser again with the demo password, so the
credentials ``make demo`` prints always work. Only for the local demo database.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

USERNAME = "admin"
PASSWORD = "admin"
EMAIL = "admin@example.com"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    user, created = get_user_model().objects.get_or_create(
        username=USERNAME, defaults={"email": EMAIL}
    )
    user.is_active = user.is_staff = user.is_superuser = True
    user.set_password(PASSWORD)
    user.save()
    print(f"Demo superuser {USERNAME!r} {'created' if created else 'ready'}.")


if __name__ == "__main__":
    main()
