# hvbench: one entry point for every task. `make help` lists them.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

DATA_DIR  ?= $(if $(filter bay,$(NETWORK)),data/pems-bay,data/pems)
MODEL_DIR ?= artifacts/forecaster
SEED      ?= 42
DAYS      ?= $(if $(filter bay,$(NETWORK)),7,30)
START     ?= 2024-03-01

# make run's variables (TARGET, SCHED, BUDGET, RECORDS, ...) are the run request's, defined
# once with their defaults in harness/src/hvbench_harness/spec.py; `make help` lists them. Every
# variable on the command line must be known here or there: `make run RECORD=100` is refused
# with the closest name instead of running the default 20,000 records.
GIVEN_VARS := $(foreach v,$(MAKEOVERRIDES),$(firstword $(subst =, ,$(v))))
ifneq ($(GIVEN_VARS),)
UNKNOWN_VARS := $(shell $(PYTHON) harness/src/hvbench_harness/spec.py check-make \
	$(firstword $(MAKEFILE_LIST)) $(GIVEN_VARS))
ifneq ($(UNKNOWN_VARS),)
$(error $(UNKNOWN_VARS))
endif
endif

# Every variable make knows (its own and the run request's) comes from the command line only:
# one left in the environment (`HOST=x make teardown`) would act unseen.
FROM_ENV := $(strip $(foreach v,$(shell $(PYTHON) harness/src/hvbench_harness/spec.py make-names \
	$(firstword $(MAKEFILE_LIST))),$(if $(filter environment%,$(origin $(v))),$(v))))
ifneq ($(FROM_ENV),)
$(error $(FROM_ENV) set in the environment: give it on make's command line (NAME=value), or unset it)
endif

# Where runs write results/<run-id>/ and make report reads them.
RESULTS   ?= results

# make campaign: CAMPAIGN=campaigns/<name>.yml runs every point of the file (campaigns/README.md)
# into $(RESULTS)/<name>/; RESUME=1 goes on with an interrupted one. make report CAMPAIGN=...
# reports it into $(OUT)/<name>/. make rerun RUN=<run-id> repeats a run from its meta.json.
CAMPAIGN ?=
RESUME   ?=
RUN      ?=
# make check: ENFORCE=1 applies the tuning first (a testbed: make provision's host_tuning).
ENFORCE  ?=

# make report: RUNS picks runs (names or globs, comma-separated; default all in results/),
# REF names a reference configuration (e.g. sched=credit), DEADLINE_MS adds the share of records
# over it, XLIM_MS cuts the ECDFs' x axis (curves past it are marked with their maximum).
RUNS        ?=
OUT         ?= report
REF         ?=
DEADLINE_MS ?=
XLIM_MS     ?=
INCLUDE_FAILED ?=

# make provision / make teardown / make run: HOST names a one-off host (user@host or host; root
# or sudo), else the hosts of INVENTORY are used. TARGET picks the hypervisor group.
HOST      ?=
INVENTORY ?= inventory/sample
# make sched: ACTION=check|apply|read|reset for the real-time VM on a testbed's host: on KVM its
# vCPUs (SCHED=none|cfs|deadline|fifo with BUDGET/PERIOD, or PRIORITY for fifo), on Xen its
# cpupool and domain (SCHED=rtds|credit|credit2 with BUDGET/PERIOD/EXTRATIME: EXTRATIME=0 by
# default, so the budget is a limit; or WEIGHT/CAP, with the pool's TSLICE_US (credit) and
# RATELIMIT_US (credit, credit2)). The readback goes to build/sched.json.
ACTION    ?= apply

KAFKA_LIBS := build/kafka/libs
FLINK_LIB  := build/flink/lib
# The agent (hostagent/) as a wheel: provisioning installs it on the hosts, the guest bundle
# carries it into the guests. A fixed timestamp keeps the wheel byte-for-byte the same when its
# sources are, so a second provision changes nothing.
AGENT_SOURCES := $(shell find hostagent/src -type f -not -path '*/__pycache__/*' \
	-not -path '*.egg-info/*' 2>/dev/null) hostagent/pyproject.toml
AGENT_WHEEL   := build/agent/.built
# Everything the guest roles install, in one file: wheels (from the registries), jars, model, data.
GUEST_BUNDLE ?= build/guest-bundle.tar
BUNDLE_DIR    = $(GUEST_BUNDLE:.tar=)
# The third-party packages the guest roles install (roles/kafka, flink, job, producers); their
# dependencies come along, pinned by constraints.txt. async-timeout: the guests run Debian 12's
# Python 3.11.2, for which redis (from apache-beam) needs it; pip here resolves for this Python.
# pyyaml: the harness, which a neighbour VM with a copy of the workload runs.
GUEST_PACKAGES := apache-flink ai-edge-litert confluent-kafka numpy pandas async-timeout pyyaml
GUEST_SOURCES  := $(shell find flink-job/src producers/src tsc_timer/src harness/src analysis/src \
	-type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -not -name '*.so' 2>/dev/null) \
	flink-job/pyproject.toml producers/pyproject.toml tsc_timer/pyproject.toml \
	harness/pyproject.toml analysis/pyproject.toml

# Quiet TensorFlow's C++ start-up chatter; one BLAS thread keeps inference latency steady.
export TF_CPP_MIN_LOG_LEVEL := 2
export OPENBLAS_NUM_THREADS := 1

.PHONY: help venv java browser rt-tools iptables sshd kafka flink-connector data train run report model advise test test-testbed lint bench clean test-two-hosts \
	campaign campaign-check check rerun account workload-inputs provision provision-settings teardown sched vcpu-sched xen-sched agent-wheel xen-hypervisor controller-tools testbed-tools guest-bundle

# Generated: the targets' `## ` comments above and below, and make run's variables (spec.py).
help: ## this list
	@sed -n 's/^\([a-z-]*\)\( [a-z-]*\)*:.*## \(.*\)/make \1\2\t\3/p' $(firstword $(MAKEFILE_LIST)) \
		| expand -t 28
	@echo
	@$(PYTHON) harness/src/hvbench_harness/spec.py help

venv: $(STAMP)

# The pinned packages as wheels, kept once per pin set: pip's own cache kept none of its
# downloads on the machines here, so every fresh clone's venv fetched about 900 MB again.
# Built into a folder of this make's own, then renamed, so that a build cut short or two at
# once never leave a half-filled folder under the final name.
WHEELS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hvbench/wheels-$(shell cat requirements.txt constraints.txt | sha256sum | cut -c1-16)

# The venv is rebuilt whenever a pin changes. On a fresh Debian 12, python3 lacks venv/ensurepip
# until python3-venv is installed, so install it first (we run as root there).
# tsc_timer is a C extension: it needs gcc and Python's headers (python3-dev on Debian).
$(STAMP): requirements.txt constraints.txt flink-job/pyproject.toml tsc_timer/pyproject.toml producers/pyproject.toml harness/pyproject.toml analysis/pyproject.toml hostagent/pyproject.toml tsc_timer/src/tsc_timer/_tsc.c
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v[:2] == (3, 11) else "hvbench needs Python 3.11 (Debian 12), found %d.%d" % v[:2])'
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { apt-get update -q && apt-get install -y -q python3-venv; }
	@command -v gcc >/dev/null && $(PYTHON) -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
		|| { apt-get update -q && apt-get install -y -q gcc python3-dev; }
	$(PYTHON) -m venv $(VENV)
	@test -d $(WHEELS) || { rm -rf $(WHEELS).$$$$ \
		&& $(VENV)/bin/pip wheel -q --disable-pip-version-check -w $(WHEELS).$$$$ -r requirements.txt -c constraints.txt \
		&& { mv -T $(WHEELS).$$$$ $(WHEELS) 2>/dev/null || rm -rf $(WHEELS).$$$$; }; }
	@# uv links the wheels' files from its cache (~/.cache/uv) and byte-compiles them (keep it:
	@# where PYTHONDONTWRITEBYTECODE is set, as on the CI machine, every process would compile
	@# each module it imports again). pip took 106 s here, unpacking each wheel anew.
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-index --find-links $(WHEELS) -c constraints.txt uv
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --offline --no-index --find-links $(WHEELS) \
		--link-mode hardlink --compile-bytecode -r requirements.txt -c constraints.txt
	@# hvbench's own packages build with the venv's setuptools (pinned): pip's isolated builds
	@# fetched setuptools from PyPI for each of the six again (28-41 s against 11-14 s)
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
		-e hostagent -e flink-job -e tsc_timer -e producers -e harness -e analysis
	@touch $@

# Java runs the Kafka broker and Flink; Maven resolves their jars from Maven Central.
java:
	@command -v java >/dev/null && command -v mvn >/dev/null \
		|| { apt-get update -q && apt-get install -y -q default-jre-headless maven; }

# BASELINE=1 measures the noise floor with cyclictest (Debian's rt-tests); NOISE= on the bare
# target runs its loads with stress-ng.
rt-tools:
	@command -v cyclictest >/dev/null && command -v stress-ng >/dev/null \
		|| { apt-get update -q && apt-get install -y -q rt-tests stress-ng; }

# The guests' routes test (tests/roles/test_guest_peers.py) runs iptables in network namespaces.
iptables:
	@command -v iptables >/dev/null || { apt-get update -q && apt-get install -y -q iptables; }

# The harness's shared SSH connections are tested against a private sshd (harness/tests).
sshd:
	@command -v ssh >/dev/null && test -x /usr/sbin/sshd \
		|| { apt-get update -q && apt-get install -y -q openssh-client openssh-server; }

# The report test opens the page in a real headless browser.
browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

kafka: $(KAFKA_LIBS)/.resolved
$(KAFKA_LIBS)/.resolved: producers/kafka/pom.xml | java
	mvn -q -B -f producers/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory=$(CURDIR)/$(KAFKA_LIBS)
	@touch $@

flink-connector: $(FLINK_LIB)/.resolved
$(FLINK_LIB)/.resolved: flink-job/connector/pom.xml | java
	mvn -q -B -f flink-job/connector/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory=$(CURDIR)/$(FLINK_LIB)
	@touch $@

data: $(STAMP) ## generate PeMS-layout traffic data into DATA_DIR [DAYS START SEED NETWORK]
	$(PY) -m hvbench_job.generate --out $(DATA_DIR) --start $(START) --days $(DAYS) --seed $(SEED) \
		--network $(or $(NETWORK),freeway)

# The LSTM learns from the six freeway detectors' data (the study's); NETWORK=bay runs use it too.
TRAIN_DATA = $(if $(filter bay,$(NETWORK)),data/pems,$(DATA_DIR))
# The guest bundle carries both networks' data: the freeway's (TRAIN_DATA) and the bay's.
BAY_DATA_DIR ?= data/pems-bay
train: $(STAMP) ## train the LSTM and export it for serving into MODEL_DIR [EPOCHS SEED]
	@ls $(TRAIN_DATA)/*.txt.gz >/dev/null 2>&1 || \
		$(MAKE) --no-print-directory data NETWORK=freeway DATA_DIR=$(TRAIN_DATA)
	$(PY) -m hvbench_job.forecast.train --data $(TRAIN_DATA) --out $(MODEL_DIR) --seed $(SEED) $(if $(EPOCHS),--epochs $(EPOCHS))

# TARGET=bare runs everything here; TARGET=kvm or xen runs in the guests of a provisioned
# testbed (HOST= or INVENTORY=), with the harness here; unset, the inventory implies it.
# Each target below builds what its verb needs, then runs `hvbench VERB` (harness/cli.py).
HVBENCH = PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/hvbench
# Which testbed the Ansible verbs use: INVENTORY, or a one-off HOST (with TARGET=kvm|xen the
# first time; harness inventory.py writes build/inventory/hosts.yml).
WHERE = --inventory $(INVENTORY)$(if $(HOST), --host $(HOST))$(if $(TARGET), --target $(TARGET))
# make run: every NAME=value of make's command line goes to the harness as it is, so that the
# run request has one table (spec.py); the inputs' defaults are make's, since make builds them.
RUN_ARGS = DATA_DIR=$(DATA_DIR) MODEL_DIR=$(MODEL_DIR) RESULTS=$(RESULTS) INVENTORY=$(INVENTORY) \
	$(MAKEOVERRIDES)

# The request is checked first (it prints the target: given, or what the inventory implies),
# so a bad setting is refused before the bare target's inputs are built: training takes minutes.
run: $(STAMP) $(if $(filter-out 0,$(BASELINE))$(NOISE),rt-tools) ## the experiment: here (bare), or HOST=/INVENTORY= a testbed; the variables below
	@target=$$($(HVBENCH) run $(RUN_ARGS) --validate-only) && \
		if test "$$target" = bare; then $(MAKE) --no-print-directory workload-inputs; fi
	$(HVBENCH) run $(RUN_ARGS)

# What a run on this machine reads: Kafka's and the connector's jars, the data, the model.
workload-inputs: $(STAMP) kafka flink-connector
	@ls $(DATA_DIR)/*.txt.gz >/dev/null 2>&1 || $(MAKE) --no-print-directory data
	@test -f $(MODEL_DIR)/manifest.json || $(MAKE) --no-print-directory train

# The campaign file is checked whole before anything runs (also by `... target`).
CAMPAIGN_NAME = $(basename $(notdir $(CAMPAIGN)))
campaign: $(STAMP) ## CAMPAIGN=campaigns/<name>.yml [RESUME=1]: a grid of runs (campaigns/README.md)
	@test -n "$(CAMPAIGN)" || { echo "make campaign: CAMPAIGN=campaigns/<name>.yml" >&2; exit 1; }
	@target=$$($(HVBENCH) campaign target $(CAMPAIGN)) && \
		{ test $$target != bare || $(MAKE) --no-print-directory workload-inputs rt-tools; } && \
		hosts=$$($(PY) -m hvbench_harness.inventory $(INVENTORY) $(HOST) $(TARGET)) && \
		$(HVBENCH) campaign run $(CAMPAIGN) --results $(RESULTS) $(if $(RESUME),--resume) \
			$(if $(filter-out 0,$(CONCURRENT)),--concurrent) \
			--data $(DATA_DIR) --model $(MODEL_DIR) $$(test $$target = bare || echo --inventory $$hosts)

campaign-check: $(STAMP) ## check every campaign file (nothing runs)
	$(HVBENCH) campaign validate campaigns/*.yml

# This machine, or with HOST= or INVENTORY= (hosts in it) the testbed's host and guests.
check: $(STAMP) ## is this machine (or HOST=/INVENTORY=) ready to measure on? [ENFORCE=1 REQUIRE=...]
	@$(HVBENCH) check $(WHERE)$(if $(ENFORCE), --enforce)$(if $(REQUIRE), --require $(REQUIRE))

rerun: $(STAMP) ## RUN=<run-id>: repeat a run from its results and compare the two
	@test -n "$(RUN)" || { echo "make rerun: RUN=<run-id> (a directory in $(RESULTS)/)" >&2; exit 1; }
	$(HVBENCH) rerun --run $(RUN) --results $(RESULTS)

# make account: RUN is results/<run-id> (written as failed, with raw/: updated in place unless
# RESULTS= is given) or work/<run-id> (results not written, e.g. a full disk: into RESULTS).
account: $(STAMP) ## RUN=results/<run-id> or work/<run-id>: account a run again from its raw files [RESULTS]
	@test -n "$(RUN)" || { echo "make account: RUN=results/<run-id> or work/<run-id>" >&2; exit 1; }
	$(HVBENCH) rerun --account $(RUN)$(if $(filter command line environment,$(origin RESULTS)), --results $(RESULTS))

lint: $(STAMP) ## ruff, ansible-lint (production profile), playbook syntax, campaign files
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH ansible-lint --offline -q --profile production playbooks/ roles/ inventory/
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH ansible-playbook --syntax-check playbooks/*.yml
	$(PY) -m hvbench_harness.campaign validate campaigns/*.yml

# The controller builds guest images with mmdebstrap (from the distribution's mirror) and keeps
# the testbed's SSH key, which the guests trust, in build/ssh/.
controller-tools:
	@command -v mmdebstrap >/dev/null && command -v qemu-img >/dev/null && command -v mke2fs >/dev/null \
		|| { apt-get update -q && apt-get install -y -q mmdebstrap qemu-utils e2fsprogs; }
	@test -f build/ssh/id_ed25519 || { mkdir -p build/ssh && ssh-keygen -q -t ed25519 -N '' -C hvbench -f build/ssh/id_ed25519; }

# GUEST_BUNDLE, MODEL_DIR and DATA_DIR may point elsewhere (the tests bundle a small model).
guest-bundle: $(GUEST_BUNDLE) ## what the guest roles install (wheels, jars, model, data), in one file
$(GUEST_BUNDLE): $(STAMP) $(AGENT_WHEEL) $(KAFKA_LIBS)/.resolved $(FLINK_LIB)/.resolved constraints.txt $(GUEST_SOURCES)
	@ls $(TRAIN_DATA)/*.txt.gz >/dev/null 2>&1 || \
		$(MAKE) --no-print-directory data NETWORK=freeway DATA_DIR=$(TRAIN_DATA)
	@ls $(BAY_DATA_DIR)/*.txt.gz >/dev/null 2>&1 || \
		$(MAKE) --no-print-directory data NETWORK=bay DATA_DIR=$(BAY_DATA_DIR)
	@test -f $(MODEL_DIR)/manifest.json || $(MAKE) --no-print-directory train
	rm -rf $(BUNDLE_DIR) && mkdir -p $(BUNDLE_DIR)/kafka $(BUNDLE_DIR)/flink $(BUNDLE_DIR)/data
	$(VENV)/bin/pip wheel -q --disable-pip-version-check -w $(BUNDLE_DIR)/wheels -c constraints.txt $(GUEST_PACKAGES)
	$(VENV)/bin/pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w $(BUNDLE_DIR)/wheels \
		./flink-job ./tsc_timer ./producers ./harness ./analysis
	cp build/agent/*.whl constraints.txt $(BUNDLE_DIR)/wheels/
	cp -r $(KAFKA_LIBS) $(BUNDLE_DIR)/kafka/libs && cp -r $(FLINK_LIB) $(BUNDLE_DIR)/flink/lib
	cp -r $(MODEL_DIR) $(BUNDLE_DIR)/model && cp -r $(TRAIN_DATA) $(BUNDLE_DIR)/data/pems
	cp -r $(BAY_DATA_DIR) $(BUNDLE_DIR)/data/pems-bay
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --exclude=.resolved \
		-C $(BUNDLE_DIR) -cf $@.tmp . && mv $@.tmp $@ && rm -rf $(BUNDLE_DIR)

agent-wheel: $(AGENT_WHEEL) ## the agent (hostagent/) as a wheel in build/agent/, for the hosts
$(AGENT_WHEEL): $(STAMP) $(AGENT_SOURCES)
	rm -rf build/agent build/agent-src && mkdir -p build/agent
	@# built from a clean copy, without a setuptools build/ an earlier in-tree build left (its
	@# stale files would go into the wheel)
	cp -r hostagent build/agent-src && rm -rf build/agent-src/build build/agent-src/src/*.egg-info
	SOURCE_DATE_EPOCH=315532800 $(VENV)/bin/pip wheel -q --disable-pip-version-check --no-deps \
		--no-build-isolation -w build/agent ./build/agent-src
	rm -rf build/agent-src && touch $@

# The Xen hypervisor with RTDS, built from the distribution's source package (registries only).
# XEN_BUILD=controller builds it here, once, and provisioning copies it to the host; the
# controller must run the host's distribution release. XEN_BUILD=host builds it on the host.
XEN_BUILD ?= controller
XEN_DIR   ?= build/xen
xen-hypervisor: $(XEN_DIR)/xen-rtds.gz ## build the Xen hypervisor with RTDS from Debian's source into build/xen
$(XEN_DIR)/xen-rtds.gz: roles/xen_host/files/build-xen-hypervisor $(wildcard roles/xen_host/files/xen-patches/*)
	roles/xen_host/files/build-xen-hypervisor $(XEN_DIR)

PROVISION_DEPS_kvm =
PROVISION_DEPS_xen = $(if $(filter controller,$(XEN_BUILD)),$(XEN_DIR)/xen-rtds.gz)
PROVISION_NEEDS = provision-settings $(STAMP) controller-tools $(AGENT_WHEEL) $(GUEST_BUNDLE)
provision: $(PROVISION_NEEDS) $(PROVISION_DEPS_$(TARGET)) ## HOST=host TARGET=kvm|xen (or INVENTORY=): make a bare host a testbed
	$(HVBENCH) provision $(WHERE) --guest-bundle $(GUEST_BUNDLE)$(if $(PROVISION_DEPS_$(TARGET)), --xen-prebuilt $(XEN_DIR))

# Checked before anything is built or touched.
provision-settings:
	@case "$(TARGET)" in kvm|xen) ;; *) echo "make provision: TARGET=kvm or xen; got TARGET=$(TARGET)" >&2; exit 1;; esac
	@case "$(XEN_BUILD)" in controller|host) ;; *) echo "make provision: XEN_BUILD=controller or host; got $(XEN_BUILD)" >&2; exit 1;; esac

teardown: $(STAMP) ## remove the guests (HOST= TARGET= or INVENTORY=)
	$(HVBENCH) teardown $(WHERE)

# make sched: the real-time VM's scheduler setting on a testbed's host, through its agent
# (playbooks/sched.yml). Its NAME=value words go to `hvbench sched` as they are (SCHED, BUDGET,
# PERIOD, ...: make help's names), which checks the setting first, so that a bad one never
# reaches a host; read and reset take none. The hypervisor comes from TARGET or the inventory.
# vcpu-sched (KVM) and xen-sched (Xen) are the same with TARGET given.
vcpu-sched: TARGET = kvm
xen-sched: TARGET = xen
vcpu-sched xen-sched: sched ## make sched on a KVM or a Xen host
sched: $(STAMP) ## the real-time VM's scheduler setting on a testbed host: SCHED= ... ACTION=check|apply|read|reset
	$(HVBENCH) sched $(ACTION) $(filter-out ACTION=% HOST=% INVENTORY=% TARGET=%,$(MAKEOVERRIDES)) \
		$(WHERE) --readback build/sched.json

REPORT_RESULTS = $(if $(CAMPAIGN),$(RESULTS)/$(CAMPAIGN_NAME),$(RESULTS))
REPORT_OUT     = $(if $(CAMPAIGN),$(OUT)/$(CAMPAIGN_NAME),$(OUT))
report: $(STAMP) ## figures and tables into OUT=report [RUNS=a,rtds-* REF=sched=credit DEADLINE_MS XLIM_MS CAMPAIGN INCLUDE_FAILED=1]
	$(HVBENCH) report --results $(REPORT_RESULTS) --out $(REPORT_OUT)$(if $(RUNS), --runs '$(RUNS)')$(if $(REF), --ref '$(REF)')$(if $(DEADLINE_MS), --deadline-ms $(DEADLINE_MS))$(if $(XLIM_MS), --xlim-ms $(XLIM_MS))$(if $(filter 1,$(INCLUDE_FAILED)), --include-failed)

# make model fits the performance model to a campaign's runs (or RUNS= in RESULTS) and saves
# it beside them; make advise asks it for the smallest budget that meets SLO (docs/model.md).
SLO    ?=
RATE   ?=
KNOB   ?=
VERIFY ?=

model: $(STAMP) ## CAMPAIGN=... [RUNS=]: fit the performance model (mean … max from the settings), held-out errors
	$(HVBENCH) model fit --results $(REPORT_RESULTS)$(if $(RUNS), --runs '$(RUNS)')

advise: $(STAMP) $(if $(filter 1,$(VERIFY)),workload-inputs rt-tools) ## CAMPAIGN=... SCHED= SLO='p99<=20' [RATE PERIOD NOISE KNOB VERIFY=1]: the smallest budget predicted to meet the SLO
	$(HVBENCH) advise --fit $(REPORT_RESULTS)/model --sched $(SCHED) --slo '$(SLO)'$(if $(RATE), --rate $(RATE))$(if $(PERIOD), --period $(PERIOD))$(if $(NOISE), --noise '$(NOISE)')$(if $(KNOB), --knob $(KNOB))$(if $(filter 1,$(VERIFY)), --verify)

# The provisioning tests boot a QEMU guest as the bare-metal host (TCG) and build images with
# mmdebstrap from the distribution's mirror; the KVM module reaches this machine through an
# sshd of its own (openssh-server), as the machine that plays the guests.
testbed-tools:
	@command -v qemu-system-x86_64 >/dev/null && command -v mmdebstrap >/dev/null \
		&& command -v qemu-img >/dev/null && command -v ssh >/dev/null && test -x /usr/sbin/sshd \
		|| { apt-get update -q && apt-get install -y -q qemu-system-x86 qemu-utils mmdebstrap e2fsprogs \
			openssh-client openssh-server; }

# Test tiers (docs/testing.md). make test: lint, unit and the real Kafka + Flink integration,
# with a budget of 8 minutes on 2 cores (docs/testing.md has its figures). make test-testbed:
# QEMU guests play the bare-metal host and are provisioned for real (KVM, and Xen under TCG).
# .ci/run runs both.
# The unit tests run on both cores (pytest-xdist: mostly model fits and report figures); the
# real Kafka + Flink integration then runs alone, one broker and one job at a time.
test: lint kafka flink-connector browser rt-tools iptables sshd ## lint, unit tests and the real Kafka + Flink integration (budget 8 min, docs/testing.md)
	$(PY) -m pytest -q -n 2 -m "not testbed and not slow and not integration" --durations=10
	$(PY) -m pytest -q -m "integration and not testbed and not slow" --durations=15

# The KVM and the Xen module run one after the other: side by side they took 47 to 69 minutes
# in CI, and the contention is what the boot and provision failures came from (a Xen provision
# outlasted its 30 minutes beside the KVM host's). Each restores its provisioned host from a
# layer in the test cache when nothing that provisioning reads has changed
# (tests/testbed/layers.py; HVBENCH_TESTBED_FRESH=1 makes them again). The slow tier runs beside
# the first module whose host was restored, else after both (tests/testbed/tier.py).
# docs/testing.md has the figures. -rs prints what a restored layer covered, with its key and age.
test-testbed: $(STAMP) kafka flink-connector rt-tools testbed-tools agent-wheel ## QEMU guests play the host and are provisioned for real: KVM, then Xen; then real campaigns here
	$(PY) tests/testbed/tier.py

# Two QEMU hosts as one KVM testbed (tests/testbed/test_two_hosts.py): about 17 minutes on two
# cores, more than CI's time allows, so run on its own.
test-two-hosts: $(STAMP) kafka flink-connector testbed-tools agent-wheel ## two QEMU hosts provisioned as one testbed: routes between their guests, the setting on both (not in CI)
	$(PY) -m pytest -q -m two_hosts --durations=10 tests/testbed/test_two_hosts.py

bench: $(STAMP) kafka flink-connector ## speed and memory figures (not tests)
	@test -f $(MODEL_DIR)/manifest.json || $(MAKE) --no-print-directory train
	$(PY) bench/bench_inference.py --model $(MODEL_DIR)
	$(PY) bench/bench_routing.py
	$(PY) bench/bench_tsc.py
	$(PY) bench/bench_report.py
	$(PY) bench/bench_pipeline.py --model $(MODEL_DIR) --data $(DATA_DIR)
	@ls data/pems-bay/*.txt.gz >/dev/null 2>&1 || \
		$(MAKE) --no-print-directory data NETWORK=bay DATA_DIR=data/pems-bay
	$(PY) bench/bench_scale.py --model $(MODEL_DIR) --data $(DATA_DIR) --bay-data data/pems-bay
	$(PY) bench/bench_trace.py --model $(MODEL_DIR) --data $(DATA_DIR)

clean: ## remove generated data, artifacts, build/ and the venv
	rm -rf $(VENV) data artifacts bench/out build work report
