package tablemap_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/tablemap"
	"github.com/outboxrelay/relay/relay"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAttachRefusesWhatDoesNotFit: a mapping naming a missing column, an
// id column that is no uuid, a relay-* header, or a table that does not
// exist is refused with ErrMapping and a message naming the problem, and
// leaves no trigger; a dry run leaves none either.
func TestAttachRefusesWhatDoesNotFit(t *testing.T) {
	_, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE public.ob (id bigint PRIMARY KEY, uid uuid, aggregatetype text, aggregateid text, type text, payload jsonb, "relay-x" text)`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    tablemap.Mapping
		want string
	}{
		{tablemap.Mapping{Table: "public.ob", ID: "uid", Topic: "t.${kind}"}, `topic template column "kind" is not a column of public.ob (it has aggregateid, aggregatetype, id, payload, relay-x, type, uid)`},
		{tablemap.Mapping{Table: "public.ob"}, `id column "id" is bigint; the event id must be a uuid`},
		{tablemap.Mapping{Table: "public.ob", ID: "uid", Headers: []string{"relay-x"}}, `header names starting with relay- are the relay's`},
		{tablemap.Mapping{Table: "public.missing"}, `there is no table "public.missing"`},
	} {
		_, err := tablemap.Attach(ctx, conn, c.m, false)
		if !errors.Is(err, tablemap.ErrMapping) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Attach(%+v) = %v, want ErrMapping saying %q", c.m, err, c.want)
		}
	}
	sql, err := tablemap.Attach(ctx, conn, tablemap.Mapping{Table: "public.ob", ID: "uid"}, true)
	if err != nil || !strings.Contains(sql, "CREATE TRIGGER") {
		t.Fatalf("dry run: %v\n%s", err, sql)
	}
	var triggers int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.ob'::regclass`).Scan(&triggers); err != nil || triggers != 0 {
		t.Fatalf("%d triggers on the table after refusals and a dry run (%v)", triggers, err)
	}
}

// TestNullTopicColumnIsADeadLetterNotAnError: a row whose topic column is
// NULL is copied with a topic naming the column, which the relay's topic
// check refuses (so it becomes a dead letter), instead of failing the
// service's INSERT; a NULL header is left out; a text payload is its
// UTF-8 bytes.
func TestNullTopicColumnIsADeadLetterNotAnError(t *testing.T) {
	_, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE public.ob (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tablemap.Attach(ctx, conn, tablemap.Mapping{Table: "public.ob"}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO public.ob VALUES (gen_random_uuid(), NULL, 'a-1', NULL, 'héllo')`); err != nil {
		t.Fatalf("the service's INSERT failed: %v", err)
	}
	var topic string
	var headers, payload []byte
	if err := conn.QueryRow(ctx, `SELECT topic, headers::text, payload FROM outbox.events`).Scan(&topic, &headers, &payload); err != nil {
		t.Fatal(err)
	}
	if topic != "outbox.event.${aggregatetype} is NULL" || relay.ValidTopic(topic) == nil {
		t.Errorf("topic %q (valid: %v), want one naming the NULL column that the relay refuses", topic, relay.ValidTopic(topic))
	}
	if string(headers) != "{}" || string(payload) != "héllo" {
		t.Errorf("headers %s, payload %q", headers, payload)
	}
}
