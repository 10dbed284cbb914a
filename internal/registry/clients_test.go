package registry_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// The clients' schemas: v2 adds a field with a default.
const (
	clientV1 = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`
	clientV2 = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"},
{"name":"note","type":["null","string"],"default":null}]}`
)

// client is a real schema-registry client driven through a script in
// testdata/clients.
type client struct {
	name string
	cmd  func(args ...string) *exec.Cmd
}

// pythonClient is Debian's python3-confluent-kafka (with python3-avro and
// python3-requests), run by the system Python the packages install into.
func pythonClient(t *testing.T) client {
	t.Helper()
	const python = "/usr/bin/python3"
	probe := exec.Command(python, "-c", "import confluent_kafka, confluent_kafka.schema_registry, confluent_kafka.avro, avro, requests")
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("the Python client is missing (apt-get install python3-confluent-kafka python3-avro python3-requests; .ci/run does): %v\n%s", err, out)
	}
	script, _ := filepath.Abs("testdata/clients/client.py")
	return client{name: "python", cmd: func(args ...string) *exec.Cmd { return exec.Command(python, append([]string{script}, args...)...) }}
}

// nodeClient is kafkajs with @kafkajs/confluent-schema-registry from npm,
// installed into testdata/clients by `npm ci` (.ci/run does).
func nodeClient(t *testing.T) client {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (.ci/run installs nodejs): %v", err)
	}
	dir, _ := filepath.Abs("testdata/clients")
	for _, pkg := range []string{"kafkajs", "@kafkajs/confluent-schema-registry"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("npm package %s is missing: run npm ci --prefix internal/registry/testdata/clients (.ci/run does): %v", pkg, err)
		}
	}
	return client{name: "node", cmd: func(args ...string) *exec.Cmd {
		c := exec.Command(node, append([]string{filepath.Join(dir, "client.js")}, args...)...)
		c.Dir = dir
		return c
	}}
}

func (c client) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := c.cmd(args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	done := make(chan struct{})
	timer := time.AfterFunc(2*time.Minute, func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.Output()
	close(done)
	if err != nil {
		t.Fatalf("%s client %v: %v\n%s%s", c.name, args[0], err, out, stderr.String())
	}
	return string(out)
}

func TestClientPython(t *testing.T) { testClient(t, pythonClient(t)) }

func TestClientNode(t *testing.T) { testClient(t, nodeClient(t)) }

// testClient: the client registers the schema's two versions in the
// embedded registry; the test writes Avro rows to the outbox (with the
// latest version, with a version named by the schema-version header, and
// one that matches nothing); the relay validates and publishes them in the
// wire format; the client consumes them from the embedded broker and
// decodes each with its deserializer, which looks the schema up by the id
// in the record.
func testClient(t *testing.T, c client) {
	ctx := context.Background()
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", httpAddr,
		"--kafka-addr", kafkaAddr, "--poll-interval", "100ms", "--schema-registry", "--schema-topics", "orders", "--schema-wire-format")
	e2e.WaitRole(t, p, "leader", 30*time.Second)
	registryURL := "http://" + httpAddr
	dir := t.TempDir()
	register := func(text string) int {
		t.Helper()
		path := filepath.Join(dir, "schema.avsc")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"register", registryURL, "orders-value", path}
		if c.name == "node" {
			args = []string{"register", registryURL, "orders-value", "AVRO", path}
		}
		id, err := strconv.Atoi(strings.TrimSpace(c.run(t, args...)))
		if err != nil {
			t.Fatalf("%s client printed no id: %v", c.name, err)
		}
		return id
	}
	admin := pgtest.Connect(t, url)
	insert := func(payload []byte, headers string) {
		t.Helper()
		var h *string
		if headers != "" {
			h = &headers
		}
		if _, err := admin.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', 'k', $1, $2)`, payload, h); err != nil {
			t.Fatal(err)
		}
	}
	type want struct {
		value map[string]any
		id    int
	}
	var wants []want
	write := func(schema string, id int, value map[string]any, headers string) {
		t.Helper()
		b, err := avro.Marshal(avro.MustParse(schema), value)
		if err != nil {
			t.Fatal(err)
		}
		insert(b, headers)
		wants = append(wants, want{value, id})
	}

	id1 := register(clientV1)
	for i := range 5 {
		write(clientV1, id1, map[string]any{"id": "v1-" + strconv.Itoa(i), "qty": i}, "")
	}
	insert([]byte("not avro at all, far too long for the record"), "")
	id2 := register(clientV2)
	if id2 == id1 {
		t.Fatalf("v2 got v1's id %d", id1)
	}
	for i := range 5 {
		note := any(nil)
		if i%2 == 0 {
			note = "note " + strconv.Itoa(i)
		}
		write(clientV2, id2, map[string]any{"id": "v2-" + strconv.Itoa(i), "qty": 10 + i, "note": note}, "")
	}
	write(clientV1, id1, map[string]any{"id": "v1-late", "qty": 99}, `{"schema-version":"1"}`)
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	out := c.run(t, "consume", kafkaAddr, "orders", strconv.Itoa(len(wants)), registryURL)
	sc := bufio.NewScanner(strings.NewReader(out))
	var i int
	for ; sc.Scan(); i++ {
		var got struct {
			Key      string         `json:"key"`
			Value    map[string]any `json:"value"`
			SchemaID int            `json:"schema_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
			t.Fatalf("%s client line %d: %v: %s", c.name, i, err, sc.Text())
		}
		if i >= len(wants) {
			t.Fatalf("%s client read more records than written: %s", c.name, sc.Text())
		}
		w := wants[i]
		wantJSON, _ := json.Marshal(w.value)
		var wantValue map[string]any
		json.Unmarshal(wantJSON, &wantValue)
		if got.Key != "k" || got.SchemaID != w.id || !reflect.DeepEqual(got.Value, wantValue) {
			t.Fatalf("%s client record %d: key %q schema %d value %v; want key k schema %d value %v", c.name, i, got.Key, got.SchemaID, got.Value, w.id, wantValue)
		}
	}
	if i != len(wants) {
		t.Fatalf("%s client decoded %d records, want %d:\n%s", c.name, i, len(wants), out)
	}
	var dead int
	var reason string
	if err := admin.QueryRow(ctx, `SELECT count(*), coalesce(max(reason), '') FROM outbox.dead_letters`).Scan(&dead, &reason); err != nil {
		t.Fatal(err)
	}
	if dead != 1 || reason != "schema_invalid" {
		t.Fatalf("dead letters: %d (reason %q), want the one invalid event as schema_invalid", dead, reason)
	}
	t.Logf("%s client registered ids %d and %d and decoded %d records the relay published", c.name, id1, id2, i)
}
