# hvbench's tasks (`make help`): each makes what its verb asks (harness build.py), runs `hvbench VERB`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The run request's table, run with the system python3: it checks variables before the venv exists.
SPEC    = PYTHONPATH=harness/src:analysis/src $(PYTHON) -m hvbench_harness.spec
WORKLOAD_PACKAGES := flink-job tsc_timer producers harness analysis
DATA_DIR  ?= $(if $(filter bay,$(NETWORK)),data/pems-bay,data/pems)
MODEL_DIR ?= artifacts/forecaster
SEED      ?= 42
DAYS      ?= $(if $(filter bay,$(NETWORK)),7,30)
START     ?= 2024-03-01
# A variable is known here (`?=`) or to the run request, else refused (with the closest name).
UNKNOWN_VARS := $(if $(MAKEOVERRIDES),$(shell $(SPEC) check-make Makefile $(foreach v,$(MAKEOVERRIDES),$(firstword $(subst =, ,$(v))))))
$(if $(UNKNOWN_VARS),$(error $(UNKNOWN_VARS)))
FROM_ENV := $(strip $(foreach v,$(shell $(SPEC) make-names Makefile),$(if $(filter environment%,$(origin $(v))),$(v))))
$(if $(FROM_ENV),$(error $(FROM_ENV) set in the environment: give it on make's command line (NAME=value), or unset it))
# Where runs write results/<run-id>/ (a campaign's: <name>/<run-id>/) and make report reads them.
RESULTS  ?= results
CAMPAIGN ?=
RESUME   ?=
REPLAY   ?=
RUN      ?=
ENFORCE  ?=
# make report's, make model's and make advise's (docs/running.md, docs/model.md).
RUNS        ?=
REFERENCES  ?=
OUT         ?= report
REF         ?=
DEADLINE_MS ?=
XLIM_MS     ?=
INCLUDE_FAILED ?=
PNG            ?=
SLO    ?=
RATE   ?=
KNOB   ?=
VERIFY ?=
# A testbed: HOST=user@host (root or sudo) with TARGET=kvm|xen, else INVENTORY's hosts.
HOST      ?=
INVENTORY ?= inventory/sample
PURGE     ?=
ACTION    ?= apply
GUEST_BUNDLE ?= build/guest-bundle.tar
BAY_DATA_DIR ?= data/pems-bay
XEN_BUILD ?= controller
XEN_SUITE ?=
XEN_DIR   ?= build/xen$(if $(XEN_SUITE),-$(XEN_SUITE))
KAFKA_LIBS := build/kafka/libs
FLINK_LIB  := build/flink/lib
AGENT_WHEEL := build/agent/.built
sources = $(shell find $(1) -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -not -name '*.so' 2>/dev/null)
AGENT_SOURCES := $(call sources,hostagent/src) hostagent/pyproject.toml
GUEST_SOURCES := $(call sources,$(WORKLOAD_PACKAGES:=/src)) $(WORKLOAD_PACKAGES:=/pyproject.toml)
# The LSTM learns from the six freeway detectors' data (the study's); NETWORK=bay runs use it too.
TRAIN_DATA = $(if $(filter bay,$(NETWORK)),data/pems,$(DATA_DIR))
# $(call data-at,DIR,NETWORK) and $(model-at): the data and the model, made where there are none.
data-at = ls $(1)/*.txt.gz >/dev/null 2>&1 || $(MAKE) --no-print-directory data NETWORK=$(2) DATA_DIR=$(1)
model-at = test -f $(MODEL_DIR)/manifest.json || $(MAKE) --no-print-directory train
HVBENCH = PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/hvbench
WHERE = --inventory $(INVENTORY)$(if $(HOST), --host $(HOST))$(if $(TARGET), --target $(TARGET))
# make run passes its NAME=value words on as they are: the request has one table (spec.py).
RUN_ARGS = DATA_DIR=$(DATA_DIR) MODEL_DIR=$(MODEL_DIR) RESULTS=$(RESULTS) INVENTORY=$(INVENTORY) $(MAKEOVERRIDES)
REPORT_RESULTS = $(if $(CAMPAIGN),$(RESULTS)/$(basename $(notdir $(CAMPAIGN))),$(RESULTS))
REPORT_OUT     = $(if $(CAMPAIGN),$(OUT)/$(basename $(notdir $(CAMPAIGN))),$(OUT))
# Quiet TensorFlow's C++ start-up chatter; one BLAS thread keeps inference latency steady.
export TF_CPP_MIN_LOG_LEVEL := 2
export OPENBLAS_NUM_THREADS := 1
.PHONY: help venv java browser rt-tools iptables sshd controller-tools testbed-tools kafka flink-connector data train workload-inputs run campaign campaign-check check rerun account report model predict advise provision teardown sched vcpu-sched xen-sched agent-wheel guest-bundle xen-hypervisor lock lint test test-testbed test-two-hosts bench clean
help: ## this list
	@sed -n 's/^\([a-z-]*\)\( [a-z-]*\)*:.*## \(.*\)/make \1\2\t\3/p' Makefile | expand -t 28
	@echo && $(SPEC) help
venv: $(STAMP)
$(STAMP): requirements.txt constraints.txt requirements.lock hostagent/pyproject.toml $(WORKLOAD_PACKAGES:=/pyproject.toml) tsc_timer/src/tsc_timer/_tsc.c
	scripts/venv $(PYTHON) hostagent $(WORKLOAD_PACKAGES)
	@touch $@
# Debian packages, installed where their commands are missing (scripts/need's table says why).
java browser rt-tools iptables sshd testbed-tools:
	@scripts/need $@
controller-tools: # and the testbed's SSH key, which the guests trust
	@scripts/need $@ && { test -f build/ssh/id_ed25519 || { mkdir -p build/ssh && ssh-keygen -q -t ed25519 -N '' -C hvbench -f build/ssh/id_ed25519; }; }
kafka: $(KAFKA_LIBS)/.resolved
flink-connector: $(FLINK_LIB)/.resolved
$(KAFKA_LIBS)/.resolved: producers/kafka/pom.xml
$(FLINK_LIB)/.resolved: flink-job/connector/pom.xml
$(KAFKA_LIBS)/.resolved $(FLINK_LIB)/.resolved: | java
	mvn -q -B -f $< dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(@D)
	@touch $@
data: $(STAMP) ## generate PeMS-layout traffic data into DATA_DIR [DAYS START SEED NETWORK]
	$(PY) -m hvbench_job.generate --out $(DATA_DIR) --start $(START) --days $(DAYS) --seed $(SEED) --network $(or $(NETWORK),freeway)
train: $(STAMP) ## train the LSTM and export it for serving into MODEL_DIR [EPOCHS SEED]
	+@$(call data-at,$(TRAIN_DATA),freeway)
	$(PY) -m hvbench_job.forecast.train --data $(TRAIN_DATA) --out $(MODEL_DIR) --seed $(SEED) $(if $(EPOCHS),--epochs $(EPOCHS))
# What a run here reads: the bare target asks for it once the request is checked (build.py).
workload-inputs: $(STAMP) kafka flink-connector
	+@$(call data-at,$(DATA_DIR),$(NETWORK))
	+@$(model-at)
run: $(STAMP) ## the experiment: here (bare), or HOST=/INVENTORY= a testbed; the variables below
	$(HVBENCH) run $(RUN_ARGS)
campaign: $(STAMP) ## CAMPAIGN=campaigns/<name>.yml [RESUME=1 REPLAY=results/<recorded>]: a grid of runs (campaigns/README.md)
	@test -n "$(CAMPAIGN)" || { echo "make campaign: CAMPAIGN=campaigns/<name>.yml" >&2; exit 1; }
	@hosts=$$($(PY) -m hvbench_harness.inventory $(INVENTORY) $(HOST) $(TARGET)) && $(HVBENCH) campaign run $(CAMPAIGN) \
		--inventory $$hosts --results $(RESULTS) --data $(DATA_DIR) --model $(MODEL_DIR)$(if $(RESUME), --resume)$(if $(filter-out 0,$(CONCURRENT)), --concurrent)$(if $(REPLAY), --replay $(REPLAY))
campaign-check: $(STAMP) ## check every campaign file (nothing runs)
	$(HVBENCH) campaign validate campaigns/*.yml
check: $(STAMP) ## is this machine (or HOST=/INVENTORY=) ready to measure on? [ENFORCE=1 REQUIRE=...]
	@$(HVBENCH) check $(WHERE)$(if $(ENFORCE), --enforce)$(if $(REQUIRE), --require $(REQUIRE))
rerun: $(STAMP) ## RUN=<run-id>: repeat a run from its results and compare the two
	@test -n "$(RUN)" || { echo "make rerun: RUN=<run-id> (a directory in $(RESULTS)/)" >&2; exit 1; }
	$(HVBENCH) rerun --run $(RUN) --results $(RESULTS)
account: $(STAMP) ## RUN=results/<run-id> or work/<run-id>: account a run again from its raw files [RESULTS]
	@test -n "$(RUN)" || { echo "make account: RUN=results/<run-id> or work/<run-id>" >&2; exit 1; }
	$(HVBENCH) rerun --account $(RUN)$(if $(filter command line environment,$(origin RESULTS)), --results $(RESULTS))
lock: $(STAMP) ; @scripts/lock ## requirements.lock: every pin with its files' hashes, from PyPI (after a pin changes)
lint: $(STAMP) ## ruff, ansible-lint (production profile), playbook syntax, campaign files
	scripts/lint
# GUEST_BUNDLE, MODEL_DIR and DATA_DIR may point elsewhere (the tests bundle a small model).
guest-bundle: $(GUEST_BUNDLE) ## what the guest roles install (wheels, jars, model, data), in one file
$(GUEST_BUNDLE): $(STAMP) $(AGENT_WHEEL) $(KAFKA_LIBS)/.resolved $(FLINK_LIB)/.resolved constraints.txt $(GUEST_SOURCES)
	+@$(call data-at,$(TRAIN_DATA),freeway)
	+@$(call data-at,$(BAY_DATA_DIR),bay)
	+@$(model-at)
	scripts/guest-bundle $@ $(MODEL_DIR) $(TRAIN_DATA) $(BAY_DATA_DIR)
agent-wheel: $(AGENT_WHEEL) ## the agent (hostagent/) as a wheel in build/agent/, for the hosts
$(AGENT_WHEEL): $(STAMP) $(AGENT_SOURCES)
	scripts/agent-wheel
	@touch $@
xen-hypervisor: $(XEN_DIR)/xen-rtds.gz ## the Xen hypervisor with RTDS from Debian's source, in build/xen[-XEN_SUITE]
$(XEN_DIR)/xen-rtds.gz: scripts/xen-hypervisor roles/xen_host/files/build-xen-hypervisor $(wildcard roles/xen_host/files/xen-patches/*)
	scripts/xen-hypervisor $(XEN_DIR) $(XEN_SUITE)
provision: $(STAMP) ## HOST=host TARGET=kvm|xen (or INVENTORY=) [XEN_BUILD=host | XEN_SUITE=trixie]: make a bare host a testbed
	$(HVBENCH) provision $(WHERE) --guest-bundle $(GUEST_BUNDLE) --xen-build $(XEN_BUILD) --xen-dir $(XEN_DIR) --xen-suite '$(XEN_SUITE)'
teardown: $(STAMP) ## remove the guests (HOST= TARGET= or INVENTORY=) [PURGE=1: all make provision set too, then reboot]
	$(HVBENCH) teardown $(WHERE)$(if $(filter 1,$(PURGE)), --purge)
# make sched's words go to `hvbench sched` as they are: it checks them before any host hears.
vcpu-sched: TARGET = kvm
xen-sched: TARGET = xen
vcpu-sched xen-sched: sched ## make sched on a KVM or a Xen host
sched: $(STAMP) ## the real-time VM's scheduler setting on a testbed host: SCHED= ... ACTION=check|apply|read|reset
	$(HVBENCH) sched $(ACTION) $(filter-out ACTION=% HOST=% INVENTORY=% TARGET=%,$(MAKEOVERRIDES)) $(WHERE) --readback build/sched.json
report: $(STAMP) ## figures and tables into OUT=report [RUNS=a,rtds-* REF=sched=credit DEADLINE_MS XLIM_MS CAMPAIGN INCLUDE_FAILED=1 PNG=1]
	$(HVBENCH) report --results $(REPORT_RESULTS) --out $(REPORT_OUT)$(if $(RUNS), --runs '$(RUNS)')$(if $(REF), --ref '$(REF)')$(if $(DEADLINE_MS), --deadline-ms $(DEADLINE_MS))$(if $(XLIM_MS), --xlim-ms $(XLIM_MS))$(if $(filter 1,$(INCLUDE_FAILED)), --include-failed)$(if $(filter 1,$(PNG)), --png)
model: $(STAMP) ## CAMPAIGN=... [RUNS= REFERENCES=]: fit the performance model (mean … max from the settings), held-out errors
	$(HVBENCH) model fit --results $(REPORT_RESULTS)$(if $(RUNS), --runs '$(RUNS)')$(if $(REFERENCES), --references '$(REFERENCES)')
predict: $(STAMP) ; $(HVBENCH) predict --run $(RUN) --sched $(SCHED)$(if $(TARGET), --target $(TARGET))$(if $(BUDGET), --budget $(BUDGET))$(if $(PERIOD), --period $(PERIOD))$(if $(CAP), --cap $(CAP))$(if $(WEIGHT), --weight $(WEIGHT))$(if $(EXTRATIME), --extratime $(EXTRATIME))$(if $(DEADLINE_MS), --deadline-ms $(DEADLINE_MS)) ## RUN=results/<traced run> SCHED= BUDGET= [TARGET PERIOD CAP WEIGHT EXTRATIME DEADLINE_MS]: the setting's latencies predicted before measuring
advise: $(STAMP) ## CAMPAIGN=... SCHED= SLO='p99<=20' [RATE PERIOD NOISE KNOB VERIFY=1]: the smallest budget predicted to meet the SLO
	$(HVBENCH) advise --fit $(REPORT_RESULTS)/model --sched $(SCHED) --slo '$(SLO)'$(if $(RATE), --rate $(RATE))$(if $(PERIOD), --period $(PERIOD))$(if $(NOISE), --noise '$(NOISE)')$(if $(KNOB), --knob $(KNOB))$(if $(filter 1,$(VERIFY)), --verify)
test: lint kafka flink-connector browser rt-tools iptables sshd ## lint, unit tests and the real Kafka + Flink integration (budget 8 min, docs/testing.md)
	$(PY) -m pytest -q -n 2 -m "not testbed and not slow and not integration" --durations=10
	$(PY) -m pytest -q -m "integration and not testbed and not slow" --durations=15
test-testbed: $(STAMP) kafka flink-connector rt-tools testbed-tools agent-wheel ## QEMU guests play the host and are provisioned for real: KVM, then Xen; then real campaigns here
	$(PY) tests/testbed/tier.py
test-two-hosts: $(STAMP) kafka flink-connector testbed-tools agent-wheel ## two QEMU hosts provisioned as one testbed: routes between their guests, the setting on both (not in CI)
	$(PY) -m pytest -q -m two_hosts --durations=10 tests/testbed/test_two_hosts.py
bench: $(STAMP) kafka flink-connector ## speed and memory figures (not tests)
	+@$(model-at)
	+@$(call data-at,data/pems-bay,bay)
	scripts/bench $(MODEL_DIR) $(DATA_DIR) data/pems-bay
clean: ## remove generated data, artifacts, build/ and the venv
	rm -rf $(VENV) data artifacts bench/out build work report
