package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/pgtest"
)

const (
	orderV1 = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`
	// v2 adds a field with a default: compatible every way.
	orderV2 = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"},
  {"name":"note","type":["null","string"],"default":null}]}`
	// broken changes qty's type and adds a field without a default.
	orderBroken = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"string"},
  {"name":"currency","type":"string"}]}`
	paymentV1      = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer"}},"required":["id"]}`
	shipmentV1     = "syntax = \"proto3\";\npackage shop;\nmessage Shipment {\n  string id = 1;\n  int32 qty = 2;\n}\n"
	shipmentBroken = "syntax = \"proto3\";\npackage shop;\nmessage Shipment {\n  string id = 1;\n  string qty = 2;\n}\n"
	// paymentBroken makes amount required and a string.
	paymentBroken = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"string"}},"required":["id","amount"]}`
)

// schemaRepo is a git repository with a schemas directory, as a service's
// repository would have.
type schemaRepo struct {
	t   *testing.T
	dir string
}

func newSchemaRepo(t *testing.T) *schemaRepo {
	r := &schemaRepo{t: t, dir: t.TempDir()}
	r.git("init", "-q", "-b", "main")
	if err := os.Mkdir(filepath.Join(r.dir, "schemas"), 0o755); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *schemaRepo) git(args ...string) {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-C", r.dir, "-c", "user.name=ci", "-c", "user.email=ci@example.com"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func (r *schemaRepo) write(name, text string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, "schemas", name), []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *schemaRepo) commit(msg string) {
	r.git("add", "-A")
	r.git("commit", "-q", "-m", msg)
}

// TestSchemaCheckGit runs `relay schema check --against git:main` the way
// a CI job on a branch would: a compatible change passes, a breaking one
// fails with each violation in plain words.
func TestSchemaCheckGit(t *testing.T) {
	repo := newSchemaRepo(t)
	repo.write("orders-value.avsc", orderV1)
	repo.write("payments-value.json", paymentV1)
	repo.write("shipments-value.proto", shipmentV1)
	repo.commit("v1")
	repo.git("checkout", "-q", "-b", "change")
	check := func() (int, string) {
		r := relay(t, nil, "schema", "check", "--dir", filepath.Join(repo.dir, "schemas"), "--against", "git:main")
		return r.Code, r.Stdout + r.Stderr
	}
	if code, out := check(); code != 0 || !strings.Contains(out, "orders-value") || !strings.Contains(out, "unchanged") {
		t.Fatalf("unchanged files: exit %d:\n%s", code, out)
	}
	repo.write("orders-value.avsc", orderV2)
	if code, out := check(); code != 0 || !strings.Contains(out, "orders-value ("+filepath.Join(repo.dir, "schemas", "orders-value.avsc")+"): compatible under FULL_TRANSITIVE") {
		t.Fatalf("a compatible change: exit %d:\n%s", code, out)
	}
	repo.commit("v2")
	repo.write("orders-value.avsc", orderBroken)
	repo.write("payments-value.json", paymentBroken)
	repo.write("shipments-value.proto", shipmentBroken)
	code, out := check()
	for _, want := range []string{
		"qty: field 2 changed type from int32 to string",
		"qty: type changed from int to string",
		"currency: field was added without a default",
		"amount: type changed from integer to string",
		"amount: property became required",
		"3 of 3 schema(s) break their contract",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if t.Failed() {
		t.Fatalf("output:\n%s", out)
	}
	// With the breaking change committed on the branch, main is still the
	// reference.
	repo.commit("break")
	if code, _ := check(); code != 1 {
		t.Fatalf("a committed breaking change: exit %d, want 1", code)
	}
}

// TestSchemaRegisterAndCheck registers schema files, then checks changes
// against the registered versions, as a deploy job and a CI job would.
func TestSchemaRegisterAndCheck(t *testing.T) {
	url := pgtest.NewDatabase(t)
	db := []string{"--database-url", url}
	if r := relay(t, nil, append([]string{"migrate", "up"}, db...)...); r.Code != 0 {
		t.Fatalf("migrate up: exit %d: %s", r.Code, r.Stderr)
	}
	repo := newSchemaRepo(t)
	dir := []string{"--dir", filepath.Join(repo.dir, "schemas")}
	run := func(args ...string) (int, string) {
		r := relay(t, nil, append(append(args, dir...), db...)...)
		return r.Code, r.Stdout + r.Stderr
	}
	repo.write("orders-value.avsc", orderV1)
	repo.write("payments-value.json", paymentV1)
	if code, out := run("schema", "check"); code != 0 || strings.Count(out, "new subject") != 2 {
		t.Fatalf("check before any registration: exit %d:\n%s", code, out)
	}
	if code, out := run("schema", "register"); code != 0 || !strings.Contains(out, "orders-value") || !strings.Contains(out, "version 1") {
		t.Fatalf("register: exit %d:\n%s", code, out)
	}
	repo.write("orders-value.avsc", orderBroken)
	code, out := run("schema", "check")
	if code != 1 || !strings.Contains(out, "qty: type changed from int to string") || !strings.Contains(out, "payments-value") {
		t.Fatalf("check of a breaking change: exit %d, want 1:\n%s", code, out)
	}
	code, out = run("schema", "register")
	if code != 1 || !strings.Contains(out, "nothing registered") {
		t.Fatalf("register of a breaking change: exit %d, want 1:\n%s", code, out)
	}
	// Under NONE the same change passes: the level is the subject's.
	if code, out := run("schema", "check", "--compatibility", "NONE"); code != 0 {
		t.Fatalf("check under NONE: exit %d:\n%s", code, out)
	}
	repo.write("orders-value.avsc", orderV2)
	if code, out := run("schema", "check"); code != 0 || !strings.Contains(out, "compatible under FULL_TRANSITIVE") {
		t.Fatalf("check of a compatible change: exit %d:\n%s", code, out)
	}
	if code, out := run("schema", "register"); code != 0 || !strings.Contains(out, "orders-value") || !strings.Contains(out, "version 2") {
		t.Fatalf("register of a compatible change: exit %d:\n%s", code, out)
	}
	if code, out := run("schema", "check", "--against", "svn:1"); code != 2 {
		t.Fatalf("a bad --against: exit %d, want 2:\n%s", code, out)
	}
}
