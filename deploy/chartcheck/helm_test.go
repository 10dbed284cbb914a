package chartcheck

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"helm.sh/helm/v4/pkg/strvals"
)

// The chart is checked with Helm's own packages, the ones `helm lint` and
// `helm template` run, rather than its command line: they leave out the
// cluster client, registry and plugin code, which would triple this
// module's build.

var chartDir = filepath.Join(repoRoot, "deploy", "helm", "relay")

// values merges values files (as -f) and then --set expressions.
func values(t *testing.T, files []string, set []string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vals = util.MergeTables(v.AsMap(), vals)
	}
	for _, s := range set {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	return vals
}

// helmTemplate renders the chart as `helm template orders CHART --namespace
// shop` does: values coalesced with the chart's and checked against
// values.schema.json, then every template but NOTES.txt, in name order.
func helmTemplate(t *testing.T, vals map[string]any) (manifests, notes string, err error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "orders", Namespace: "shop", IsInstall: true, Revision: 1}, nil)
	if err != nil {
		return "", "", err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return "", "", err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			notes = files[name]
			continue
		}
		if strings.TrimSpace(stripComments(files[name])) == "" {
			continue
		}
		b.WriteString("---\n# Source: " + name + "\n" + files[name] + "\n")
	}
	return b.String(), notes, nil
}

// valueSets are the chart's ci/ values files: defaults, cdc with the
// Kafka sink, leader and standby, the listener behind TLS and SASL.
func valueSets(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{"cdc-kafka-values.yaml", "default-values.yaml", "leader-standby-values.yaml", "tls-values.yaml"}
	if !slices.Equal(names, want) {
		t.Fatalf("chart ci/ holds %v, want %v", names, want)
	}
	return files
}

// TestChartLint: helm lint --strict (no message at warning or above) with
// each values set.
func TestChartLint(t *testing.T) {
	for _, f := range valueSets(t) {
		res := lint.RunAll(chartDir, values(t, []string{f}, nil), "shop")
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint --strict -f %s: %s", filepath.Base(f), m.Error())
			}
		}
	}
	// The linter itself finds what is wrong: a values set it must refuse.
	res := lint.RunAll(chartDir, values(t, nil, []string{"database.existingSecret=db", "source.type=wal"}), "shop")
	if res.HighestSeverity < support.ErrorSev {
		t.Errorf("helm lint passed source.type=wal: %v", res.Messages)
	}
}

// TestChartTemplate renders the chart with each values set, decodes every
// manifest strictly into its Kubernetes type and checks its semantics.
func TestChartTemplate(t *testing.T) {
	for _, f := range valueSets(t) {
		name := filepath.Base(f)
		out, notes, err := helmTemplate(t, values(t, []string{f}, nil))
		if err != nil {
			t.Fatalf("helm template -f %s: %v", name, err)
		}
		m := decodeAll(t, name, []byte(out))
		facts := m.check(t, name)
		if facts.runContainers != 1 {
			t.Fatalf("%s: %d relay run containers, want 1", name, facts.runContainers)
		}
		args := strings.Join(facts.args[0], " ")
		switch name {
		case "default-values.yaml":
			adv := "orders-relay.shop.svc.cluster.local:9092"
			if facts.embedded != 1 || !slices.Equal(facts.readiness, []string{"/readyz"}) || !strings.Contains(args, "--kafka-advertised-addr="+adv) {
				t.Errorf("%s: %+v", name, facts)
			}
			if !strings.Contains(notes, adv) {
				t.Errorf("%s: NOTES.txt does not give the bootstrap address %s:\n%s", name, adv, notes)
			}
		case "cdc-kafka-values.yaml":
			for _, want := range []string{"--source=cdc", "--slot=relay_orders", "--sink=kafka", "--kafka-brokers=kafka-0.kafka:9093,kafka-1.kafka:9093", "--kafka-tls-ca-file=/etc/relay/kafka-tls/ca.crt", "--kafka-sasl-mechanism=SCRAM-SHA-512", "--kafka-sasl-user=relay-orders"} {
				if !strings.Contains(args, want) {
					t.Errorf("%s: args %s lack %s", name, args, want)
				}
			}
			if !strings.Contains(out, "name: RELAY_KAFKA_SASL_PASSWORD") {
				t.Errorf("%s: no RELAY_KAFKA_SASL_PASSWORD from a Secret", name)
			}
		case "leader-standby-values.yaml":
			if !strings.Contains(out, "kind: Deployment") || !strings.Contains(out, "replicas: 2") || !strings.Contains(out, "kind: PodDisruptionBudget") || !slices.Equal(facts.readiness, []string{"/healthz"}) {
				t.Errorf("%s: want a Deployment of 2 with a PodDisruptionBudget, ready on /healthz: %+v", name, facts)
			}
			if !strings.Contains(notes, "one leads") {
				t.Errorf("%s: NOTES.txt does not explain the standby:\n%s", name, notes)
			}
		case "tls-values.yaml":
			for _, want := range []string{"--kafka-addr=0.0.0.0:9093", "--kafka-advertised-addr=relay.example.com:9093", "--listener-tls-client-ca-file=/etc/relay/listener-tls/ca.crt", "--listener-users-file=/etc/relay/listener-users/users", "--listener-acl-file=/data/acls.json", "--listener-acl-default=deny", "--retain=168h"} {
				if !strings.Contains(args, want) {
					t.Errorf("%s: args %s lack %s", name, args, want)
				}
			}
			if !strings.Contains(out, "storageClassName: fast-ssd") || !strings.Contains(out, "type: LoadBalancer") || !strings.Contains(out, "storage: 50Gi") {
				t.Errorf("%s: persistence or Service type not rendered", name)
			}
		}
	}
}

// TestChartRefuses: values the relay cannot run with fail at render time
// with a message naming the value, and values.schema.json refuses wrong
// types, unknown values and unknown keys.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "database.existingSecret"},
		{[]string{"database.existingSecret=db", "replicaCount=2"}, "replicaCount > 1 needs sink.type=kafka"},
		{[]string{"database.existingSecret=db", "sink.type=kafka"}, "sink.kafka.brokers"},
		{[]string{"database.existingSecret=db", "listener.tls.enabled=true"}, "listener.tls.existingSecret"},
		{[]string{"database.existingSecret=db", "listener.sasl.enabled=true"}, "listener.sasl.usersSecret"},
		{[]string{"database.existingSecret=db", "sink.type=kafka", "sink.kafka.brokers={k:9092}", "sink.kafka.sasl.mechanism=PLAIN"}, "sink.kafka.sasl.existingSecret"},
		{[]string{"database.existingSecret=db", "source.type=wal"}, "/source/type"},
		{[]string{"database.existingSecret=db", "listener.port=http"}, "/listener/port"},
		{[]string{"database.existingSecret=db", "persistance.size=1Gi"}, "persistance"},
		{[]string{"database.existingSecret=db", "extraArgs={run}"}, "/extraArgs/0"},
	} {
		out, _, err := helmTemplate(t, values(t, nil, tc.set))
		if err == nil {
			t.Errorf("helm template --set %v rendered:\n%s", tc.set, out)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template --set %v: %v, want it to name %s", tc.set, err, tc.want)
		}
	}
}
