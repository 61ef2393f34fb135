# The front door: set up, run locally, launch a cluster, submit jobs, test.
# `make help` lists every target. Override any variable below on the command line:
#   make submit JOB=pong ARGS="--batch-size 10 --updates 0"
#   make logs ID=pong-20250101-120000

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

# Cluster launcher config for up/down/dashboard.
CLUSTER ?= cluster/aws.yaml
# A folder under job/: what Ray ships and runs.
JOB ?= pong
# Extra arguments for the job's trainer, e.g. ARGS="--updates 10".
ARGS ?=
# The virtualenv every target runs from, and the Python that creates it.
VENV ?= .venv
PYTHON ?= python3
# Dashboard (Jobs API) address of the cluster that jobs go to. 8265 is both the local
# head (make local-up) and a cloud head forwarded by `make dashboard`.
RAY_ADDRESS ?= http://127.0.0.1:8265
# Where `make submit` records the latest submission id; ID defaults to it.
LAST_JOB_FILE ?= .last-job
ID ?= $(shell cat $(LAST_JOB_FILE) 2>/dev/null)
# Trainer arguments for `make demo`: small enough to finish in well under a minute.
DEMO_ARGS ?= --batch-size 4 --updates 2
# The dashboard of the local head that cluster/local-ray.sh starts (Ray's default port).
LOCAL_ADDRESS := http://127.0.0.1:8265
# `make plot`: a run directory, the trainer's --run-dir (a folder or s3://bucket/prefix).
RUN ?=
# `make play`: a checkpoint (ckpt-NNNNNN.npz, a file or s3://...), or a run dir for its newest.
CHECKPOINT ?=
# `make play`: how many games to play; the first is written as a GIF.
GAMES ?= 3

BIN := $(abspath $(VENV))/bin
# Touched after a successful install; reinstalls when a requirements file changes.
INSTALLED := $(VENV)/.installed
# The job's package is the folder inside job/$(JOB) that has a train module.
PACKAGE = $(notdir $(patsubst %/train.py,%,$(wildcard job/$(JOB)/*/train.py)))
JOBS = $(notdir $(patsubst %/,%,$(dir $(patsubst %/,%,$(dir $(wildcard job/*/*/train.py))))))

# Every command below finds the venv's python and ray first, talks to clusters with
# token authentication, and gets the thread presets (infra/threads.env is KEY=VALUE).
export PATH := $(BIN):$(PATH)
export RAY_AUTH_MODE := token
include infra/threads.env
export $(shell sed -n 's/^\([A-Z_][A-Z0-9_]*\)=.*/\1/p' infra/threads.env)

# One-line checks shared by several targets.
define need-token
if [[ -z "$${RAY_AUTH_TOKEN:-}" && ! -s "$${RAY_AUTH_TOKEN_PATH:-$$HOME/.ray/auth_token}" ]]; then \
  echo "make: no Ray auth token at $${RAY_AUTH_TOKEN_PATH:-~/.ray/auth_token}; copy the cluster's token there (README, Token authentication)" >&2; exit 1; fi
endef
define need-id
if [[ -z "$(ID)" ]]; then \
  echo "make: no submission recorded in $(LAST_JOB_FILE); run \`make submit\` first or pass ID=<submission id>" >&2; exit 1; fi
endef
define need-cluster-file
if [[ ! -f "$(CLUSTER)" ]]; then \
  echo "make: cluster config $(CLUSTER) does not exist; pass CLUSTER=<file.yaml>" >&2; exit 1; fi
endef
define need-job
if [[ -z "$(PACKAGE)" ]]; then \
  echo "make: unknown job '$(JOB)'; the jobs under job/ are: $(JOBS)" >&2; exit 1; fi
endef

##@ Start here

.PHONY: help
help: ## Show this list
	@awk 'BEGIN {FS = ":.*## "} \
	  /^##@/ {printf "\n\033[1m%s\033[0m\n", substr($$0, 5)} \
	  /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-13s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "Variables: JOB=$(JOB) ARGS='$(ARGS)' CLUSTER=$(CLUSTER) RAY_ADDRESS=$(RAY_ADDRESS) VENV=$(VENV)"

.PHONY: setup
setup: $(INSTALLED) ## Create the venv from requirements-dev.txt (again when a requirements file changes)

$(INSTALLED): requirements.txt requirements-dev.txt
	@if [[ ! -x $(VENV)/bin/python ]]; then \
	  $(PYTHON) -m venv $(VENV) || { echo "make: '$(PYTHON) -m venv' failed; install Python 3.11 with its venv module (Debian: apt-get install python3-venv)" >&2; exit 1; }; \
	fi
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

.PHONY: demo
demo: $(INSTALLED) ## Start the local cluster, submit a small pong run, follow it to the end
	@$(MAKE) local-up
	@log="$$(mktemp)"; trap 'rm -f "$$log"' EXIT; rc=0; \
	RAY_ADDRESS=$(LOCAL_ADDRESS) LAST_JOB_FILE=$(LAST_JOB_FILE) python job/submit.py --wait pong -- $(DEMO_ARGS) | tee "$$log" || rc=$$?; \
	echo "demo: the local Ray cluster is still running (dashboard $(LOCAL_ADDRESS)); stop it with: make local-down"; \
	if [[ $$rc != 0 ]]; then echo "demo: the job did not succeed; its logs are above" >&2; exit 1; fi; \
	if ! grep -q '^done ' "$$log"; then echo "demo: the job succeeded but printed no 'done' line" >&2; exit 1; fi

.PHONY: test
test: $(INSTALLED) ## Run the test suite but the docker test, real two-node cluster tests included (a few minutes)
	python -m pytest

.PHONY: test-docker
test-docker: $(INSTALLED) ## ray up cluster/local.yaml here, train in the container, ray down (root, Docker, sshd)
	python -m pytest -m docker -rA

##@ Local cluster (this machine)

.PHONY: local-up
local-up: $(INSTALLED) ## Start a Ray head here with token auth unless one runs (dashboard 127.0.0.1:8265)
	@VENV=$(VENV) cluster/local-ray.sh up

.PHONY: local-status
local-status: $(INSTALLED) ## Say whether the local head runs, and show `ray status`
	@VENV=$(VENV) cluster/local-ray.sh status

.PHONY: local-down
local-down: $(INSTALLED) ## Stop the local cluster (`ray stop`: every Ray process of yours here)
	@VENV=$(VENV) cluster/local-ray.sh down

##@ Launched cluster (the launcher config CLUSTER: cluster/aws.yaml, or cluster/local.yaml)

.PHONY: up
up: $(INSTALLED) token ## Launch or update the cluster: make token, then ray up -y CLUSTER
	@$(need-cluster-file)
	ray up -y $(CLUSTER)

.PHONY: dashboard
dashboard: $(INSTALLED) ## Forward the cluster's dashboard to 127.0.0.1:8265 (keep it running)
	@$(need-cluster-file)
	ray dashboard $(CLUSTER)

.PHONY: down
down: $(INSTALLED) ## Tear the cluster down: ray down -y CLUSTER
	@$(need-cluster-file)
	ray down -y $(CLUSTER)

##@ Image and cloud account (infra/)

.PHONY: image
image: ## Build the cluster image from infra/Dockerfile (name in infra/image.env); cached rebuilds take seconds
	@infra/build-image.sh

.PHONY: preflight
preflight: $(INSTALLED) ## Check CLUSTER against your AWS account before paying: credentials, quota, zones, AMI, key pair, cost
	@$(BIN)/python infra/preflight.py $(CLUSTER)

.PHONY: token
token: $(INSTALLED) ## Create the cluster token ~/.ray/auth_token unless it exists (ray up copies it to every node)
	@$(BIN)/ray get-auth-token --generate >/dev/null
	@echo "token: ~/.ray/auth_token (keep it secret: it opens the cluster's Jobs API)"

.PHONY: docker-engine
docker-engine: ## Install Docker, debootstrap, sshd (not started), ssh, rsync if missing; start dockerd (root)
	@infra/ci-docker.sh

##@ Jobs (on the cluster at RAY_ADDRESS)

.PHONY: submit
submit: $(INSTALLED) ## Submit job/JOB with ARGS; prints its id and the commands to follow it
	@RAY_ADDRESS=$(RAY_ADDRESS) LAST_JOB_FILE=$(LAST_JOB_FILE) python job/submit.py $(JOB) -- $(ARGS)

.PHONY: logs
logs: $(INSTALLED) ## Follow the logs of the latest submission (or ID=...) until it ends
	@$(need-id); $(need-token)
	ray job logs --address $(RAY_ADDRESS) --follow $(ID)

.PHONY: status
status: $(INSTALLED) ## Show the status of the latest submission (or ID=...)
	@$(need-id); $(need-token)
	ray job status --address $(RAY_ADDRESS) $(ID)

.PHONY: list
list: $(INSTALLED) ## List every job the cluster knows
	@$(need-token)
	ray list jobs --address $(RAY_ADDRESS)

.PHONY: stop-job
stop-job: $(INSTALLED) ## Stop the latest submission (or ID=...)
	@$(need-id); $(need-token)
	ray job stop --address $(RAY_ADDRESS) $(ID)

##@ Without a cluster

.PHONY: train
train: $(INSTALLED) ## Train without Ray Jobs: cd job/JOB && python -m <package>.train ARGS
	@$(need-job)
	cd job/$(JOB) && env -u RAY_ADDRESS python -m $(PACKAGE).train $(ARGS)

.PHONY: bench
bench: $(INSTALLED) ## Benchmark pong: cd job/pong && python -m pgpong.bench ARGS
	cd job/pong && env -u RAY_ADDRESS python -m pgpong.bench $(ARGS)

##@ Watch a run (on this machine; RUN and CHECKPOINT may be on S3)

.PHONY: plot
plot: $(INSTALLED) ## Learning curves of RUN in one PNG (RUN/curve.png): reward, episode length, steps/s
	@if [[ -z "$(RUN)" ]]; then echo "make: pass RUN=<run dir>, the trainer's --run-dir (a folder or s3://bucket/prefix)" >&2; exit 1; fi
	PYTHONPATH=job/pong python -m pgpong.plot "$(RUN)" $(ARGS)

.PHONY: play
play: $(INSTALLED) ## Play GAMES games with CHECKPOINT, print each score, write the first as a GIF
	@if [[ -z "$(CHECKPOINT)" ]]; then echo "make: pass CHECKPOINT=<ckpt-NNNNNN.npz, or a run dir for its newest checkpoint>" >&2; exit 1; fi
	PYTHONPATH=job/pong python -m pgpong.play "$(CHECKPOINT)" --games $(GAMES) $(ARGS)
