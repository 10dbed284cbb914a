package registry

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup) }

// newStore migrates a fresh database and returns the registry's store in
// it, with a pool.
func newStore(t *testing.T) (*Store, *pgxpool.Pool, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	pgtest.Migrate(t, pgtest.Connect(t, url), "outbox")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := NewStore(pool, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	return s, pool, url
}

func newServer(t *testing.T) (*httptest.Server, *Store) {
	s, _, _ := newStore(t)
	mux := http.NewServeMux()
	Routes(mux, s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, s
}

type call struct {
	method, path, body string
	status             int
	// want is a fragment of the response body.
	want string
}

func do(t *testing.T, srv *httptest.Server, c call) string {
	t.Helper()
	req, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) {
		t.Fatalf("%s %s: got %d %s, want %d with %q", c.method, c.path, resp.StatusCode, b, c.status, c.want)
	}
	return string(b)
}

func schemaBody(t *testing.T, typ, schema string, extra ...string) string {
	b, err := json.Marshal(map[string]string{"schema": schema, "schemaType": typ})
	if err != nil {
		t.Fatal(err)
	}
	if len(extra) > 0 {
		return strings.TrimSuffix(string(b), "}") + "," + extra[0] + "}"
	}
	return string(b)
}

// TestRESTAPI walks the Confluent API subset in the order a serializer
// and an operator use it, including the traps other registries fell into.
func TestRESTAPI(t *testing.T) {
	srv, _ := newServer(t)
	v1 := avroRecord(fID)
	v2 := avroRecord(fID, fQtyDef)
	bad := avroRecord(fID, fQtyStr)
	for _, c := range []call{
		{method: "GET", path: "/subjects", status: 200, want: "[]"},
		{method: "GET", path: "/config", status: 200, want: `"compatibilityLevel":"FULL_TRANSITIVE"`},
		// A subject without a level of its own: 404 40408, as clients expect.
		{method: "GET", path: "/config/orders-value", status: 404, want: `"error_code":40408`},
		{method: "GET", path: "/config/orders-value?defaultToGlobal=true", status: 200, want: "FULL_TRANSITIVE"},
		// PUT /config/{s} for a subject with no version yet.
		{method: "PUT", path: "/config/orders-value", body: `{"compatibility":"backward"}`, status: 200, want: `"compatibility":"BACKWARD"`},
		{method: "GET", path: "/config/orders-value", status: 200, want: `"compatibilityLevel":"BACKWARD"`},
		{method: "PUT", path: "/config/orders-value", body: `{"compatibility":"SIDEWAYS"}`, status: 422, want: `42203`},
		// Unknown request fields are ignored.
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "", v1, `"metadata":{"properties":{"owner":"shop"}},"ruleSet":{"domainRules":[]}`), status: 200, want: `{"id":1}`},
		// The same schema again, reformatted: the same id, no new version.
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "AVRO", strings.ReplaceAll(v1, ",", " , ")), status: 200, want: `{"id":1}`},
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "AVRO", v2), status: 200, want: `{"id":2}`},
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "AVRO", bad), status: 409, want: `qty: type changed from int to string`},
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "AVRO", `{"type":"record"`), status: 422, want: `42201`},
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "PROTOBUF", `syntax = "proto3";`), status: 422, want: `it defines no message`},
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "PROTOBUF", `syntax = "proto3"; import "other.proto"; message A {}`), status: 422, want: `schema references`},
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "XML", `<a/>`), status: 422, want: `unknown schema type`},
		{method: "POST", path: "/subjects/orders-value/versions", body: `{"schema":"\"string\"","references":[{"name":"x","subject":"y","version":1}]}`, status: 422, want: `references are not supported`},
		{method: "POST", path: "/subjects/orders-value", body: schemaBody(t, "", v1), status: 200, want: `"version":1`},
		{method: "POST", path: "/subjects/orders-value", body: schemaBody(t, "", avroRecord(fID, fNote)), status: 404, want: `40403`},
		{method: "POST", path: "/subjects/nothing-value", body: schemaBody(t, "", v1), status: 404, want: `40401`},
		{method: "GET", path: "/subjects", status: 200, want: `["orders-value"]`},
		{method: "GET", path: "/subjects/orders-value/versions", status: 200, want: `[1,2]`},
		{method: "GET", path: "/subjects/orders-value/versions/latest", status: 200, want: `"version":2`},
		{method: "GET", path: "/subjects/orders-value/versions/1", status: 200, want: `"id":1`},
		{method: "GET", path: "/subjects/orders-value/versions/9", status: 404, want: `40402`},
		{method: "GET", path: "/subjects/orders-value/versions/x", status: 422, want: `42202`},
		{method: "GET", path: "/subjects/orders-value/versions/2/schema", status: 200, want: `"qty"`},
		{method: "GET", path: "/schemas/ids/2", status: 200, want: `\"qty\"`},
		{method: "GET", path: "/schemas/ids/99", status: 404, want: `40403`},
		{method: "POST", path: "/compatibility/subjects/orders-value/versions/latest?verbose=true", body: schemaBody(t, "", bad), status: 200, want: `"is_compatible":false,"messages":["qty: type changed from int to string`},
		{method: "POST", path: "/compatibility/subjects/orders-value/versions/latest", body: schemaBody(t, "", avroRecord(fID, fQtyDef, fNote)), status: 200, want: `"is_compatible":true`},
		// JSON Schema in another subject, same registry.
		{method: "POST", path: "/subjects/payments-value/versions", body: schemaBody(t, "JSON", jsonObject(pID, "id")), status: 200, want: `{"id":3}`},
		{method: "GET", path: "/schemas/ids/3", status: 200, want: `"schemaType":"JSON"`},
		{method: "POST", path: "/subjects/payments-value/versions", body: schemaBody(t, "JSON", jsonObject(pID+","+pQty, "id", "qty")), status: 409, want: `qty: property was added as required`},
		// Deletes: a hard delete only after a soft one; ids stay readable.
		{method: "DELETE", path: "/subjects/orders-value/versions/2?permanent=true", status: 404, want: `40405`},
		{method: "DELETE", path: "/subjects/orders-value/versions/2", status: 200, want: `2`},
		{method: "GET", path: "/subjects/orders-value/versions", status: 200, want: `[1]`},
		{method: "GET", path: "/subjects/orders-value/versions?deleted=true", status: 200, want: `[1,2]`},
		{method: "GET", path: "/subjects/orders-value/versions/latest", status: 200, want: `"version":1`},
		{method: "DELETE", path: "/subjects/orders-value/versions/2?permanent=true", status: 200, want: `2`},
		{method: "DELETE", path: "/subjects/orders-value", status: 200, want: `[1]`},
		{method: "GET", path: "/subjects", status: 200, want: `["payments-value"]`},
		{method: "GET", path: "/subjects?deleted=true", status: 200, want: `["orders-value","payments-value"]`},
		{method: "DELETE", path: "/subjects/orders-value?permanent=true", status: 200, want: `[1]`},
		{method: "GET", path: "/subjects/orders-value/versions", status: 404, want: `40401`},
		{method: "GET", path: "/schemas/ids/2", status: 200, want: `qty`},
		// A new first version after the hard delete: no history to check.
		{method: "POST", path: "/subjects/orders-value/versions", body: schemaBody(t, "", bad), status: 200, want: `{"id":4}`},
		{method: "DELETE", path: "/config/orders-value", status: 200, want: `BACKWARD`},
		{method: "GET", path: "/config/orders-value", status: 404, want: `40408`},
		{method: "PUT", path: "/config", body: `{"compatibility":"NONE"}`, status: 200, want: `NONE`},
		{method: "GET", path: "/config/orders-value?defaultToGlobal=true", status: 200, want: `NONE`},
		{method: "GET", path: "/schemas/types", status: 200, want: `["AVRO","JSON","PROTOBUF"]`},
		// Protobuf: registered, checked, and found again by its text.
		{method: "POST", path: "/subjects/shipments-value/versions", body: schemaBody(t, "PROTOBUF", protoMsg(pbID, pbQty)), status: 200, want: `"id"`},
		{method: "PUT", path: "/config/shipments-value", body: `{"compatibility":"FULL_TRANSITIVE"}`, status: 200, want: `FULL_TRANSITIVE`},
		{method: "POST", path: "/subjects/shipments-value/versions", body: schemaBody(t, "PROTOBUF", protoMsg(pbID, pbQtyStr)), status: 409, want: `qty: field 2 changed type from int32 to string`},
		{method: "POST", path: "/subjects/shipments-value", body: schemaBody(t, "PROTOBUF", "// a comment\n"+protoMsg(pbID, pbQty)), status: 200, want: `"schemaType":"PROTOBUF"`},
	} {
		do(t, srv, c)
	}
}
