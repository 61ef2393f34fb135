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
# `make up` and `make preflight`: SPOT=1 puts the workers on spot capacity (the head stays on demand);
# MIN_WORKERS=N starts N workers (0 up to the YAML's most) and lets the autoscaler add the rest.
# AUTODOWN=N: the head tears the cluster down N minutes after its last job, N >= 5 (0: never, its watcher
# only stops jobs at their MAX_HOURS; empty: as the YAML says: 20 for cluster/aws.yaml, 0 for cluster/local.yaml).
# MAX_NODE_HOURS=h: every node ends itself h hours after its Ray last came up (each `ray up` counts again),
# h >= 0.5 (empty: the YAML's, 4 for cluster/aws.yaml), the backstop that needs no AWS right (docs/aws.md); a
# node whose Ray never comes up ends 40 minutes after its boot.
# NODES=N TYPE=T (on the command line): N nodes of EC2 instance type T, CPUs from EC2's physical cores
# (NODES alone keeps the type, TYPE alone the count; `make preflight` names the largest size your quota allows).
# REGION=R: the AWS region of up, run, down, dashboard, preflight, iam, plan, leftovers (empty: CLUSTER's provider.region,
# us-west-2 for cluster/aws.yaml), in R's zones that offer the instance types, as EC2 says (docs/aws.md#preflight).
# NAME=N (on the command line; WSL's NAME in the environment is the host's): the cluster's name, N for up, run, down,
# dashboard, preflight, iam, leftovers (empty: CLUSTER's cluster_name, pong), and its own roles (`make iam NAME=N`).
# `make up` and `make run` refuse a cluster of that name in the region that this laptop did not launch.
# Any of them launches a copy of CLUSTER that cluster/variant.py writes into VARIANT_DIR.
REGION ?=
NAME ?=
OWN_NAME = $(if $(filter command line,$(origin NAME)),$(NAME))
# MAX_USD_PER_HOUR: `make up`, `run` and `preflight` refuse a cluster whose nodes cost more an hour on demand
# (infra/prices.yaml; 11 c5.9xlarge: 16.83) and print its cost; raise it on the command line to launch one.
# Nodes of a type or region infra/prices.yaml has no price for are refused too, unless MAX_USD_PER_HOUR=none.
MAX_USD_PER_HOUR ?= 30
SPOT ?= 0
TYPE ?=
MIN_WORKERS ?=
AUTODOWN ?=
MAX_NODE_HOURS ?=
# `make up IMAGE=<registry>/<name:tag>`: every node pulls that image (as `make image-push` printed it)
# instead of building it; also a copy of CLUSTER written by cluster/variant.py. Only from make's command
# line: an IMAGE exported in the shell is refused (need-own-image), not used or dropped without a word.
IMAGE ?=
# `make image-push` records the image it pushed in PUSHED_IMAGE_FILE: `make up`, `make run` and `make preflight`
# of cluster/aws.yaml pull it when it is in ECR, unless IMAGE is given (`IMAGE=` builds). A line before the token says which.
PUSHED_IMAGE_FILE ?= .cache/pushed-image
ifeq ($(origin IMAGE):$(CLUSTER),file:cluster/aws.yaml)
IMAGE := $(shell sed -n 's/^IMAGE=\([0-9]*\.dkr\.ecr\.[^/]*\/.*\)/\1/p' $(PUSHED_IMAGE_FILE) 2>/dev/null)
endif
# `make image-push`: the registry (host:port[/path]) to push the built image to.
REGISTRY ?=
# `make leftovers`: CONFIRM=1 removes what it lists (0 or 1, nothing else).
CONFIRM ?= 0
# `make iam BUCKET=<name>`: the S3 bucket of the runs (--run-dir s3://<name>/...), which the head's role may use.
BUCKET ?=
VARIANT_DIR ?= .cache/cluster
# `make run`: KEEP=1 leaves the cluster up at the end (0 or 1, nothing else); OUT is the local folder of
# the run and its agent (default runs/<time>).
KEEP ?= 0
OUT ?=
# `make run` and `make submit`: the job's time cap in hours; the head's watcher stops the job then, as
# `make stop-job` does. The default comes from the plan for the job's updates on the cluster's nodes
# (pongtools/timecap.py says how); an open-ended job (--updates 0) on a cluster needs it.
MAX_HOURS ?=
# A folder under job/: what Ray ships and runs.
JOB ?= pong
# Extra arguments for the job's trainer, e.g. ARGS="--updates 10" (without --updates: 60, then the job ends).
ARGS ?=
# The virtualenv every target runs from, and the Python that creates it.
VENV ?= .venv
PYTHON ?= python3
# Dashboard (Jobs API) address of the cluster that jobs go to. 8265 is both the local
# head (make local-up) and a cloud head forwarded by `make dashboard`.
RAY_ADDRESS ?= http://127.0.0.1:8265
# Where `make submit` records the latest submission id (empty: .last-job here, pongtools.submit's default);
# logs, status and stop-job take the id recorded there unless ID is given.
LAST_JOB_FILE ?=
ID ?=
# Trainer arguments for `make demo`: small enough to finish in well under a minute.
DEMO_ARGS ?= --batch-size 4 --updates 2
# The dashboard of the local head that cluster/local-ray.sh starts (Ray's default port).
LOCAL_ADDRESS := http://127.0.0.1:8265
# `make plot` (a folder or s3://bucket/prefix) and `make plan-inputs`: a run directory, the trainer's --run-dir.
RUN ?=
# `make plan-inputs`: runs (space-separated) whose updates to each milestone stand for their batch size.
MILESTONES ?=
# `make plan-inputs`: a run whose first update (a fresh policy's episodes) gives the lengths of any run's first.
FRESH ?=
# `make play` and `make judge`: a checkpoint (ckpt-NNNNNN.npz, a file or s3://...), a run dir for its newest, or
# shipped (the agent in SHIP_DIR); without it, the newest checkpoint of the latest run in RUNS_IN (make train's
# ~/pong-runs/<time>, make run's runs/<time>/run). `make ship`: the checkpoint to ship (default: RUN's newest).
CHECKPOINT ?=
RUNS_IN ?= ~/pong-runs runs
# `make test`: pytest processes (pytest-xdist); 0 runs the suite in pytest's own process.
TEST_PROCESSES ?= 2
# `make play`: how many games to play; the first is written as a GIF.
GAMES ?= 3
# `make ship`: where the exported agent (weights, metrics) and its pictures (curve, game GIF) go.
SHIP_DIR ?= job/tools/runs/agent
IMAGES_DIR ?= docs/images
# `make sweep`: BATCH:RATE[:DECAY] settings (DECAY: RMSProp's; without it, auto), each trained to
# EPISODES episodes in SWEEP_ROOT/b<BATCH>-lr<RATE>[-d<DECAY>] with the trainer's default RMSProp start.
SWEEP ?= 10:2e-3 50:4e-3 300:1e-2:0.94 300:1e-2:0.99 300:2e-2:0.94
EPISODES ?= 6000
SWEEP_ROOT ?= ~/pong-lr
# `make compare`: run dirs to compare, and the episode counts to compare them at.
RUNS ?=
AT ?= 1000,3000,6000
# `make plan`: the cluster to project, nodes x CPUs per node, and the batch size.
NODES ?= 11
CPUS ?= 18
BATCH ?= 300

BIN := $(abspath $(VENV))/bin
# The venv is filled in layers, each from its lock (requirements*.txt, written by
# `make lock` from the .in file of the same name). A layer's stamp is touched after its
# install and made again when its lock changes, so each target installs only what it needs:
#   INSTALLED  the job's runtime (requirements.txt), then this project's packages pgpong and pongtools with
#              no commands of their own (each runs as python -m), editable (pyproject.toml says why): every target
#   TOOLS      + matplotlib and Pillow (requirements-tools.txt): make plot, make play
#   TESTS      + pytest, moto, ruff (requirements-test.txt): make test, make lint
INSTALLED := $(VENV)/.installed
TOOLS := $(VENV)/.installed-tools
TESTS := $(VENV)/.installed-test
# uv installs the locks, each .pyc at install (docs/development.md#dependencies); pip installs uv, hashed.
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --quiet --require-hashes --compile-bytecode --python $(VENV)/bin/python
# How `make lock` resolves: for every platform (a laptop may be a Mac), for Python 3.11
# (the image's), every file's hash. LOCK_ARGS=--upgrade moves every unpinned package to
# its newest release; without it the versions already in the locks are kept.
LOCK_ARGS ?=
LOCK := $(UV) pip compile --quiet --universal --python-version 3.11 --generate-hashes \
  --custom-compile-command "make lock" $(LOCK_ARGS)
# The job's package is the folder inside job/$(JOB) that has a train module.
PACKAGE = $(notdir $(patsubst %/train.py,%,$(wildcard job/$(JOB)/*/train.py)))
JOBS = $(notdir $(patsubst %/,%,$(dir $(patsubst %/,%,$(dir $(wildcard job/*/*/train.py))))))
# The launcher config of `make up` and `make preflight`: CLUSTER, or its variant for SPOT, MIN_WORKERS, AUTODOWN,
# MAX_NODE_HOURS, IMAGE, NODES or TYPE. NODES and TYPE size it only from the command line (NODES's default is
# `make plan`'s; a TYPE in the shell's environment is not taken without a word).
SIZE_NODES = $(if $(filter command line,$(origin NODES)),$(NODES))
SIZE_TYPE = $(if $(filter command line,$(origin TYPE)),$(TYPE))
LAUNCH = $(if $(filter-out 0,$(SPOT))$(MIN_WORKERS)$(AUTODOWN)$(MAX_NODE_HOURS)$(IMAGE)$(SIZE_NODES)$(SIZE_TYPE)$(REGION)$(OWN_NAME),$(VARIANT_DIR)/$(basename $(notdir $(CLUSTER)))-spot$(SPOT)$(if $(MIN_WORKERS),-min$(MIN_WORKERS))$(if $(AUTODOWN),-autodown$(AUTODOWN))$(if $(MAX_NODE_HOURS),-hours$(MAX_NODE_HOURS))$(if $(IMAGE),-pull)$(if $(SIZE_NODES),-n$(SIZE_NODES))$(if $(SIZE_TYPE),-$(SIZE_TYPE))$(if $(OWN_NAME),-$(OWN_NAME))$(if $(REGION),-$(REGION)).yaml,$(CLUSTER))
# The cluster of down, dashboard and iam: CLUSTER, or with REGION or NAME its copy moved to that region or named so
# alone (ray down and ray dashboard find the cluster by its name and region, make iam scopes the roles' policies to both).
REGIONAL = $(if $(REGION)$(OWN_NAME),$(VARIANT_DIR)/$(basename $(notdir $(CLUSTER)))$(if $(OWN_NAME),-$(OWN_NAME))$(if $(REGION),-$(REGION)).yaml,$(CLUSTER))
# How every tool target runs its tool, $(PONGTOOLS).<tool>: a module of the tools package job/tools/pongtools
# (never shipped), which imports the job's package pgpong (job/pong); both installed by `make setup`.
PONGTOOLS = python -m pongtools
# How logs, status, list, stop-job, capacity and release talk to the cluster's Jobs API: pongtools.jobs,
# which says each mistake (no cluster, the token, an unknown ID) in one line where Ray's CLI prints a traceback.
JOBS_API = RAY_ADDRESS=$(RAY_ADDRESS) LAST_JOB_FILE=$(LAST_JOB_FILE) $(PONGTOOLS).jobs

# Every command below finds the venv's python and ray first, talks to clusters with
# token authentication, and gets the thread presets (infra/threads.env is KEY=VALUE).
export PATH := $(BIN):$(PATH)
export RAY_AUTH_MODE := token
include infra/threads.env
export $(shell sed -n 's/^\([A-Z_][A-Z0-9_]*\)=.*/\1/p' infra/threads.env)

# One-line checks shared by several targets.
define need-cluster-file
if [[ ! -f "$(CLUSTER)" ]]; then \
  echo "make: cluster config $(CLUSTER) does not exist; pass CLUSTER=<file.yaml>" >&2; exit 2; fi
endef
# Checks CLUSTER and the choices (a mistake: one line, exit 2, nothing written), writes the launched copy if
# any choice asks for one, and prints variant's line: what is launched, its autodown and backstop. REGIONAL after it:
# the launched copy's checks (an IMAGE in ECR of another region than the nodes') come before EC2 is asked for zones.
define write-variant
$(BIN)/python -m cluster.variant "$(CLUSTER)" --spot "$(SPOT)" --max-usd-per-hour "$(MAX_USD_PER_HOUR)" $(if $(filter file,$(origin IMAGE)),--image-from "$(PUSHED_IMAGE_FILE)") $(if $(MIN_WORKERS),--min-workers "$(MIN_WORKERS)") $(if $(AUTODOWN),--autodown "$(AUTODOWN)") $(if $(MAX_NODE_HOURS),--max-node-hours "$(MAX_NODE_HOURS)") $(if $(IMAGE),--image "$(IMAGE)") $(if $(SIZE_NODES),--nodes "$(SIZE_NODES)") $(if $(SIZE_TYPE),--instance-type "$(SIZE_TYPE)") $(if $(REGION),--region "$(REGION)") $(if $(OWN_NAME),--name "$(OWN_NAME)") $(if $(filter-out $(CLUSTER),$(LAUNCH)),--out "$(LAUNCH)") && $(write-regional)
endef
# With REGION or NAME, writes REGIONAL (quietly: write-variant's line says them); a mistake is one line, exit 2.
define write-regional
$(if $(REGION)$(OWN_NAME),$(BIN)/python -m cluster.variant "$(CLUSTER)" $(if $(REGION),--region "$(REGION)") $(if $(OWN_NAME),--name "$(OWN_NAME)") --out "$(REGIONAL)" >/dev/null,true)
endef
define say-image
echo "image path=$(if $(IMAGE),pull image=$(IMAGE) from=$(if $(filter file,$(origin IMAGE)),$(PUSHED_IMAGE_FILE),IMAGE),build image=$(shell sed -n 's/^IMAGE=//p' infra/image.env) on=every_node)"
endef
# IMAGE decides what every node runs, so it must be said on make's command line: one taken from the
# shell's environment (`?=` reads it) is refused, since using it and dropping it would both be a guess.
define need-own-image
if [[ "$(origin IMAGE)" == environment* ]]; then \
  echo "make: IMAGE=$$IMAGE comes from your shell's environment; say it on make's command line: IMAGE=<registry>/<name:tag> to pull it, IMAGE= to build the image (or unset IMAGE)" >&2; exit 2; fi
endef
# NODES, TYPE and REGION size and place what is launched, so they too come from make's command line only: one
# exported in the shell is refused as IMAGE is. Another such variable is one more word here.
OWN_VARIABLES = NODES TYPE REGION
define need-own-values
$(foreach v,$(OWN_VARIABLES),$(if $(filter environment%,$(origin $(v))),echo "make: $(v)=$($(v)) comes from your shell's environment; say it on make's command line ($(v)=$($(v))) or unset $(v)" >&2; exit 2;)) true
endef
# An IMAGE every node would pull (given, or recorded by make image-push) of another platform than the nodes'
# (infra/image.env's PLATFORM) is refused in one line, exit 2; one this machine's Docker engine lacks is not read.
define need-node-platform
$(if $(IMAGE),infra/image-platform.sh "$(IMAGE)" make --if-present,true)
endef
# What is launched against the account, where this machine has AWS credentials (infra/preflight.py --before-up): no
# cluster of its name launched elsewhere in its region (Ray's launcher and autodown tell clusters apart by
# cluster_name alone; launched here = the private key of its key pair is in ~/.ssh), its vCPUs within the quota that
# is free in its region, and node types that can run the trainer. Without credentials a line says "not checked".
define need-account
$(BIN)/python -m infra.preflight "$(LAUNCH)" --before-up $(if $(SIZE_NODES)$(SIZE_TYPE),--said "$(strip $(if $(SIZE_NODES),NODES=$(SIZE_NODES)) $(if $(SIZE_TYPE),TYPE=$(SIZE_TYPE)))")
endef
# The cluster token, made after a target's checks: a refused command writes nothing. Ray writes it (and ~/.ray)
# with the shell's umask, 0644 under the usual 022; umask 077 makes them 0600 and 0700 from the start.
define make-token
(umask 077 && $(BIN)/ray get-auth-token --generate >/dev/null) && echo "token: ~/.ray/auth_token (keep it secret: it opens the cluster's Jobs API)"
endef
# `make run`'s command line for pongtools.launch, which checks it all (--check) before anything is written.
LAUNCH_ARGS = --down-cluster $(REGIONAL) --job $(JOB) $(if $(OUT),--out "$(OUT)") --keep "$(KEEP)" \
  $(if $(MAX_HOURS),--max-hours "$(MAX_HOURS)") $(if $(MAX_NODE_HOURS),--max-node-hours "$(MAX_NODE_HOURS)")
define need-job
if [[ -z "$(PACKAGE)" ]]; then \
  echo "make: unknown job '$(JOB)'; the jobs under job/ are: $(JOBS)" >&2; exit 2; fi
endef

# `make play` and `make judge`: CHECKPOINT=shipped needs an agent in SHIP_DIR
define need-checkpoint
if [[ "$(CHECKPOINT)" == shipped && -z "$(wildcard $(SHIP_DIR)/pong-agent.npz)" ]]; then \
  echo "make: CHECKPOINT=shipped, but there is no shipped agent in $(SHIP_DIR); pass CHECKPOINT=<ckpt-NNNNNN.npz, or a run dir for its newest checkpoint>" >&2; exit 2; fi
endef
# Their checkpoint argument: CHECKPOINT's, SHIP_DIR for shipped, else the folders of the latest run.
PLAYED = $(if $(filter shipped,$(CHECKPOINT)),"$(SHIP_DIR)",$(if $(CHECKPOINT),"$(CHECKPOINT)",$(foreach r,$(RUNS_IN),--runs-in $(r))))

# Every variable a target reads is set above (`NAME ?=`, `NAME :=`) or in infra/threads.env, but REGION (the first-run
# issue's) and the settings infra/build-image.sh reads from its environment. A variable on make's command line that
# none of them is (NODE=2) is refused before anything runs, in one line: kept, it would be dropped without a word.
# Adding a variable above makes it known.
VARIABLES = $(sort $(shell sed -n 's/^\([A-Z][A-Z0-9_]*\) *[?:]*=.*/\1/p' $(MAKEFILE_LIST)) REGION LOCAL_BASE OS_IMAGE DEBIAN_MIRROR)
UNREAD := $(firstword $(filter-out $(VARIABLES),$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))))
ifneq ($(UNREAD),)
$(error $(UNREAD)=$(value $(UNREAD)): no such variable$(shell $(PYTHON) -c 'import difflib, sys; close = difflib.get_close_matches(sys.argv[1], sys.argv[2:], 1, 0.75); print(f"; did you mean {close[0]}? The" if close else "; the", "top of the Makefile says what each variable does")' $(UNREAD) $(VARIABLES)))
endif

##@ Start here

.PHONY: help
help: ## Show this list
	@awk 'BEGIN {FS = ":.*## "} \
	  /^##@/ {printf "\n\033[1m%s\033[0m\n", substr($$0, 5)} \
	  /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-13s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "Variables: JOB=$(JOB) ARGS='$(ARGS)' CLUSTER=$(CLUSTER) RAY_ADDRESS=$(RAY_ADDRESS) VENV=$(VENV)"
	@echo "Exit: make exits 2 when a target fails; the program's own status is the N of its 'make: *** [...] Error N'"
	@echo "line: 2 a mistake (one line, nothing changed), 1 a failure (one line; a traceback only for a bug), 130 Ctrl-C"

.PHONY: setup
setup: $(INSTALLED) $(TOOLS) $(TESTS) ## Create the venv with every lock: runtime, tools, tests (again when a lock changes)

# The venv and uv in it. The only step that uses pip; Python 3.11 and make are all a
# fresh machine needs.
$(UV): requirements-uv.txt
	@if [[ ! -x $(VENV)/bin/python ]]; then \
	  $(PYTHON) -m venv $(VENV) || { echo "make: '$(PYTHON) -m venv' failed; install Python 3.11 with its venv module (Debian: apt-get install python3-venv)" >&2; exit 1; }; \
	fi
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements-uv.txt
	@touch $@

$(INSTALLED): requirements.txt pyproject.toml $(UV)
	$(UV_INSTALL) -r requirements.txt
	$(UV) pip install --quiet --no-deps --no-build-isolation --compile-bytecode --python $(VENV)/bin/python --editable .
	@touch $@

$(TOOLS): requirements-tools.txt $(INSTALLED)
	$(UV_INSTALL) -r requirements-tools.txt
	@touch $@

$(TESTS): requirements-test.txt $(INSTALLED)
	$(UV_INSTALL) -r requirements-test.txt
	@touch $@

.PHONY: lock
lock: $(UV) ## Write the locks requirements*.txt from the .in files after editing a pin (LOCK_ARGS=--upgrade: all)
	$(LOCK) requirements-uv.in -o requirements-uv.txt
	$(LOCK) requirements.in -o requirements.txt
	$(LOCK) requirements-tools.in -c requirements.txt -o requirements-tools.txt
	$(LOCK) requirements-test.in -c requirements.txt -c requirements-tools.txt -o requirements-test.txt

.PHONY: lint
lint: $(TESTS) ## Check formatting and lint with ruff (settings in pyproject.toml); fails on any finding
	ruff format --check --diff .
	ruff check .

.PHONY: demo
demo: $(INSTALLED) ## Start the local cluster, submit a small pong run, follow it to the end
	@$(MAKE) local-up
	@log="$$(mktemp)"; trap 'rm -f "$$log"' EXIT; rc=0; \
	RAY_ADDRESS=$(LOCAL_ADDRESS) LAST_JOB_FILE=$(LAST_JOB_FILE) $(PONGTOOLS).submit --wait pong -- $(DEMO_ARGS) | tee "$$log" || rc=$$?; \
	echo "demo: the local Ray cluster is still running (dashboard $(LOCAL_ADDRESS)); stop it with: make local-down"; \
	if [[ $$rc != 0 ]]; then echo "demo: the job did not succeed; its logs are above" >&2; exit 1; fi; \
	if ! grep -q '^done ' "$$log"; then echo "demo: the job succeeded but printed no 'done' line" >&2; exit 1; fi

.PHONY: test
test: $(TESTS) $(TOOLS) ## Run the test suite but the docker test, real Ray clusters included, in TEST_PROCESSES processes
	python -m pytest -n $(TEST_PROCESSES) --dist loadgroup -m "not docker and not alone"
	python -m pytest -m alone

.PHONY: test-docker
test-docker: $(TESTS) ## ray up of cluster/local.yaml here and of cluster/aws.yaml on test hosts, train, down (root, Docker, sshd)
	python -m pytest -m docker -rA

##@ Local cluster (this machine)

.PHONY: local-up
local-up: $(INSTALLED) ## Start a Ray head here with token auth unless one runs (dashboard 127.0.0.1:8265)
	@VENV=$(VENV) cluster/local-ray.sh up

.PHONY: local-status
local-status: $(INSTALLED) ## Say whether the local head runs, and show `ray status`
	@VENV=$(VENV) cluster/local-ray.sh status

.PHONY: local-down
local-down: $(INSTALLED) ## Stop the head that local-up started, and only it (other Ray processes here are left alone)
	@VENV=$(VENV) cluster/local-ray.sh down

##@ Launched cluster (the launcher config CLUSTER: cluster/aws.yaml, or cluster/local.yaml)

.PHONY: up
up: $(INSTALLED) ## Launch or update the cluster: make token, then ray up -y CLUSTER (SPOT=1: spot workers; MIN_WORKERS=N; AUTODOWN=N minutes; MAX_NODE_HOURS=h)
	@$(need-cluster-file)
	@$(need-own-image)
	@$(need-own-values)
	@$(need-node-platform)
	@$(write-variant)
	@$(need-account)
	@$(say-image)
	@$(make-token)
	@echo "ray up -y $(LAUNCH)"
	@ray up -y $(LAUNCH) || $(PONGTOOLS).up_failed "$(LAUNCH)" --down-cluster "$(REGIONAL)"

.PHONY: run
run: $(TOOLS) ## Up, submit JOB with ARGS (MAX_HOURS: its cap), follow, fetch the run, ship its agent into OUT, down (KEEP=1: stay up)
	@$(need-cluster-file)
	@$(need-job)
	@$(need-own-image)
	@$(need-own-values)
	@$(need-node-platform)
	@LAST_JOB_FILE=$(LAST_JOB_FILE) $(PONGTOOLS).launch --check --cluster $(CLUSTER) $(LAUNCH_ARGS) -- $(ARGS)
	@$(write-variant)
	@$(need-account)
	@$(say-image)
	@$(make-token)
	@LAST_JOB_FILE=$(LAST_JOB_FILE) $(PONGTOOLS).launch --cluster $(LAUNCH) $(LAUNCH_ARGS) -- $(ARGS)

.PHONY: dashboard
dashboard: $(INSTALLED) ## Forward the cluster's dashboard to 127.0.0.1:8265 (keep it running)
	@$(need-cluster-file)
	@$(PONGTOOLS).clusterfile "$(CLUSTER)"
	@$(write-regional)
	ray dashboard $(REGIONAL)

.PHONY: down
down: $(INSTALLED) ## Tear the cluster down: ray down -y CLUSTER
	@$(need-cluster-file)
	@$(PONGTOOLS).clusterfile "$(CLUSTER)"
	@$(write-regional)
	ray down -y $(REGIONAL)

##@ Image and cloud account (infra/)

.PHONY: image
image: ## Build the cluster image from infra/Dockerfile for the nodes' linux/amd64 (infra/image.env); cached rebuilds take seconds
	@infra/build-image.sh

.PHONY: image-push
image-push: ## Push the built image (linux/amd64 only) to REGISTRY (host:port[/path]) once; prints the IMAGE=... for `make up IMAGE=`
	@REGISTRY="$(REGISTRY)" PUSHED_IMAGE_FILE="$(PUSHED_IMAGE_FILE)" infra/push-image.sh

.PHONY: iam
iam: $(INSTALLED) ## Make or find the head's and workers' IAM roles and instance profiles CLUSTER names (BUCKET=: S3 run bucket)
	@$(need-cluster-file)
	@$(write-regional)
	@$(BIN)/python -m infra.iam $(REGIONAL) $(if $(BUCKET),--bucket "$(BUCKET)")

.PHONY: leftovers
leftovers: $(INSTALLED) ## List what make iam, ray up and make image-push leave in AWS: roles, profiles, key pair, security group, ECR repository (CONFIRM=1: remove)
	@$(need-cluster-file)
	@if [[ "$(CONFIRM)" != 0 && "$(CONFIRM)" != 1 ]]; then echo "make: CONFIRM=$(CONFIRM) is neither 0 (list) nor 1 (remove)" >&2; exit 2; fi
	@$(write-regional)
	@$(BIN)/python -m infra.leftovers "$(REGIONAL)" $(if $(filter 1,$(CONFIRM)),--confirm) \
	  --remove-with "make leftovers CONFIRM=1$(if $(filter-out cluster/aws.yaml,$(CLUSTER)), CLUSTER=$(CLUSTER))$(if $(REGION), REGION=$(REGION))$(if $(OWN_NAME), NAME=$(OWN_NAME))"

.PHONY: preflight
preflight: $(INSTALLED) ## Check CLUSTER (SPOT, MIN_WORKERS as for up) against your AWS account: credentials, quota, zones, AMI, key pair, cost
	@$(need-cluster-file)
	@$(need-own-image)
	@$(need-own-values)
	@$(write-variant)
	@$(BIN)/python -m infra.preflight "$(LAUNCH)" --full "$(CLUSTER)"

.PHONY: token
token: $(INSTALLED) ## Create the cluster token ~/.ray/auth_token unless it exists (ray up copies it to every node)
	@$(make-token)

.PHONY: docker-engine
docker-engine: ## Install Docker, debootstrap, sshd (not started), ssh, rsync if missing; start dockerd (root)
	@infra/ci-docker.sh

##@ Jobs (on the cluster at RAY_ADDRESS)

.PHONY: submit
submit: $(INSTALLED) ## Submit job/JOB with ARGS (MAX_HOURS: its time cap); prints its id and the commands to follow it
	@RAY_ADDRESS=$(RAY_ADDRESS) LAST_JOB_FILE=$(LAST_JOB_FILE) $(PONGTOOLS).submit $(if $(MAX_HOURS),--max-hours "$(MAX_HOURS)") $(JOB) -- $(ARGS)

.PHONY: logs
logs: $(INSTALLED) ## Follow the logs of the latest submission (or ID=...) until it ends
	@$(JOBS_API) logs $(ID)

.PHONY: status
status: $(INSTALLED) ## Show the status of the latest submission (or ID=...)
	@$(JOBS_API) status $(ID)

.PHONY: list
list: $(INSTALLED) ## List every job the cluster knows
	@$(JOBS_API) list

.PHONY: stop-job
stop-job: $(INSTALLED) ## Stop the latest submission (or ID=...)
	@$(JOBS_API) stop-job $(ID)

.PHONY: capacity
capacity: $(INSTALLED) ## Show the CPUs the cluster's autoscaler is asked for (a run's request_resources)
	@$(JOBS_API) capacity

.PHONY: release
release: $(INSTALLED) ## Withdraw that request (a killed trainer's stays): idle workers may then leave
	@$(JOBS_API) release

##@ Without a cluster

.PHONY: train
train: $(INSTALLED) ## Train without Ray Jobs: cd job/JOB && python -m <package>.train ARGS
	@$(need-job)
	cd job/$(JOB) && env -u RAY_ADDRESS python -m $(PACKAGE).train $(ARGS)

.PHONY: bench
bench: $(INSTALLED) ## Benchmark the trainer against the bare emulator and the textbook design (ARGS: its flags)
	env -u RAY_ADDRESS $(PONGTOOLS).bench $(ARGS)

##@ Plan a cluster run (a model from figures measured here; no Ray needed)

.PHONY: plan
plan: $(INSTALLED) ## Project NODES x CPUS at BATCH: seconds per update, $ an hour, hours and $ to a win and from up to down
	@$(need-own-values)
	@$(PONGTOOLS).plan project --nodes $(NODES) --cpus $(CPUS) --batch-size $(BATCH) --cluster $(CLUSTER) $(if $(REGION),--region "$(REGION)") $(if $(SIZE_TYPE),--instance-type "$(SIZE_TYPE)") $(ARGS)

.PHONY: plan-inputs
plan-inputs: $(INSTALLED) ## Rebuild the plan's inputs: episode lengths from RUN's metrics (and FRESH's first update), milestones of the MILESTONES runs
	@if [[ -z "$(RUN)$(MILESTONES)$(FRESH)" ]]; then echo "make: pass RUN=<run dir> (a trainer's --run-dir or an exported run), MILESTONES=<run dirs>, FRESH=<run dir>, or several" >&2; exit 2; fi
	$(PONGTOOLS).plan inputs $(if $(RUN),--run "$(RUN)") $(if $(FRESH),--fresh "$(FRESH)") $(foreach m,$(MILESTONES),--milestones "$(m)") $(ARGS)

##@ Watch a run (on this machine; RUN and CHECKPOINT may be on S3)

.PHONY: plot
plot: $(TOOLS) ## Learning curves of RUN in one PNG (RUN/curve.png): reward, episode length, steps/s
	@if [[ -z "$(RUN)" ]]; then echo "make: pass RUN=<run dir>, the trainer's --run-dir (a folder or s3://bucket/prefix)" >&2; exit 2; fi
	$(PONGTOOLS).plot "$(RUN)" $(ARGS)

.PHONY: play
play: $(TOOLS) ## Play GAMES games with CHECKPOINT (default: your latest run; shipped: the shipped agent), print each score, write the first as a GIF
	@$(need-checkpoint)
	@$(PONGTOOLS).play $(PLAYED) --games $(GAMES) $(ARGS)

.PHONY: judge
judge: $(TOOLS) ## Does CHECKPOINT (default: your latest run; shipped: the shipped agent) beat the built-in AI? 10 greedy games at each of seeds 0-19
	@$(need-checkpoint)
	@$(PONGTOOLS).judge $(PLAYED) $(ARGS)

.PHONY: ship
ship: $(TOOLS) ## Export RUN's newest checkpoint (or CHECKPOINT=) as the agent in SHIP_DIR; draw its curve and a game
	@if [[ -z "$(RUN)" ]]; then echo "make: pass RUN=<run dir>, the trainer's --run-dir of the run to ship" >&2; exit 2; fi
	$(PONGTOOLS).ship "$(RUN)" --out $(SHIP_DIR) $(if $(CHECKPOINT),--checkpoint "$(CHECKPOINT)") $(ARGS)
	$(PONGTOOLS).plot $(SHIP_DIR) --out $(IMAGES_DIR)/agent-curve.png
	$(PONGTOOLS).play $(SHIP_DIR) --games 1 --out $(IMAGES_DIR)/agent-game.gif

##@ Experiments (hours: run them in the background; they resume where they stopped)

.PHONY: sweep
sweep: $(INSTALLED) ## Train each BATCH:RATE[:DECAY] of SWEEP to EPISODES episodes in SWEEP_ROOT, one after the other
	env -u RAY_ADDRESS $(PONGTOOLS).sweep --root $(SWEEP_ROOT) --episodes $(EPISODES) $(SWEEP) $(ARGS)

.PHONY: compare
compare: $(INSTALLED) ## Running reward of the run dirs RUNS at AT episodes (ARGS=--markdown for a table)
	@if [[ -z "$(RUNS)" ]]; then echo "make: pass RUNS=\"<run dir> ...\", e.g. RUNS=\"$$(echo $(SWEEP_ROOT)/*)\"" >&2; exit 2; fi
	$(PONGTOOLS).compare $(RUNS) --at $(AT) $(ARGS)

##@ The docs

# cog (cogapp) runs the Python in a Markdown comment beside each sample and writes its output below it
# (docs/development.md#the-docs); pongtools.samples holds what those comments call.
DOCS_PAGES = README.md $(wildcard docs/*.md)
COG = cog -p "from pongtools.samples import judge_tables, line_of, milestone_table, run_table, saved, shell, span, table"
# `make docs` rewrites the pages (-r); tests/test_docs.py runs it with COG_ACTION=--check, which fails on a stale one.
COG_ACTION ?= -r

.PHONY: docs
docs: $(TESTS) $(TOOLS) ## Regenerate every sample of README.md and docs/: cog re-runs the command beside each
	$(COG) $(COG_ACTION) $(DOCS_PAGES)
