# Two commands: `make demo` (admin + live django-q2 cluster on SQLite) and `make test`.
# `make help` lists the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
VENV_DJ61 ?= .venv-dj61
# The Python >= 3.12 of the Django 6.1 legs; searched for only when needed.
DJ61_PYTHON ?= $(shell bash scripts/find_python312.sh)
PORT ?= 8000

export VENV VENV_DJ61 PORT

STAMP := .requirements.stamp
DEMO_STAMP := .demo-requirements.stamp

.PHONY: help venv venv-dj61 demo test lint clean

help:
	@echo "make demo    migrate db.sqlite3, create admin/admin, run a django-q2 cluster and"
	@echo "             the admin at http://127.0.0.1:$(PORT)/admin/ (PORT=... to change)"
	@echo "make test    lint, then the suite on SQLite and PostgreSQL (Django 5.2), then on"
	@echo "             Django 6.1 when a Python >= 3.12 exists (see scripts/test.sh)"
	@echo "make lint    ruff, ruff format --check, mypy, manage.py check, makemigrations --check"
	@echo "make venv    create $(VENV) and install requirements/dev.txt"
	@echo "make clean   remove $(VENV), $(VENV_DJ61) and tool caches (keeps db.sqlite3)"

# Reinstall only when a requirements file is newer than the stamp.
$(VENV)/$(STAMP): requirements/base.txt requirements/dev.txt
	@bash scripts/venv.sh "$(PYTHON)" 3.11 "$(VENV)" requirements/dev.txt
	@touch "$@"

venv: $(VENV)/$(STAMP)

# `make demo` installs requirements/demo.txt only (no test or lint tooling); `make test` adds
# requirements/dev.txt to the same venv.
$(VENV)/$(DEMO_STAMP): requirements/base.txt requirements/demo.txt
	@bash scripts/venv.sh "$(PYTHON)" 3.11 "$(VENV)" requirements/demo.txt
	@touch "$@"

$(VENV_DJ61)/$(STAMP): requirements/base.txt requirements/dev.txt requirements/django61.txt
	@if [ -z "$(DJ61_PYTHON)" ]; then \
		echo "error: no Python >= 3.12 found; pass DJ61_PYTHON=/path/to/python3.12" >&2; \
		exit 1; \
	fi
	@bash scripts/venv.sh "$(DJ61_PYTHON)" 3.12 "$(VENV_DJ61)" requirements/dev.txt \
		requirements/django61.txt
	@touch "$@"

venv-dj61: $(VENV_DJ61)/$(STAMP)

demo: $(VENV)/$(DEMO_STAMP)
	@bash scripts/demo.sh

test: venv
	@bash scripts/test.sh

lint: venv
	@bash scripts/lint.sh

clean:
	rm -rf "$(VENV)" "$(VENV_DJ61)" .mypy_cache .ruff_cache .pytest_cache .coverage htmlcov
