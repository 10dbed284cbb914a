package monitoring_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// promtool runs Prometheus's promtool with args and fails the test on a
// non-zero exit, or when promtool is missing: a machine without it cannot
// check what ships.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (.ci/run does)")
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRules: the rules load, and their unit tests pass.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool(t, "check", "rules", "alerts.yml")
	promtool(t, "test", "rules", "alerts_test.yml")
}

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// grafanaVars are the dashboard's variables, as a query would have them
// expanded.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")

// TestDashboard: the dashboard is whole (a uid, its variables, panels
// with unique ids, each on the chosen data source with at least one
// query), and every query parses as PromQL: promtool checks them as the
// expressions of recording rules.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard: uid %q, title %q, %d panels", d.UID, d.Title, len(d.Panels))
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	if !slices.Contains(vars, "datasource") || !slices.Contains(vars, "instance") {
		t.Fatalf("dashboard variables %v; want datasource and instance", vars)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			expr, _ := json.Marshal(grafanaVars.Replace(q.Expr))
			rules.WriteString("      - record: dashboard:panel" + strings.ReplaceAll(q.RefID, " ", "") + "\n        expr: " + string(expr) + "\n")
		}
	}
	file := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", file)
}

var metricName = regexp.MustCompile(`\brelay_[a-z0-9_]+`)

// namedMetrics returns the relay metrics the rules and the dashboard use.
func namedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rules), "\n") {
		if expr, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			for _, m := range metricName.FindAllString(expr, -1) {
				used[m] = append(used[m], "alerts.yml")
			}
		}
	}
	for _, p := range readDashboard(t).Panels {
		for _, q := range p.Targets {
			for _, m := range metricName.FindAllString(q.Expr, -1) {
				used[m] = append(used[m], "dashboard panel "+p.Title)
			}
		}
	}
	if len(used) < 10 {
		t.Fatalf("only %d relay metrics found in the rules and the dashboard: %v", len(used), used)
	}
	return used
}
