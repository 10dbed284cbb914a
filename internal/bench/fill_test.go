package bench

import (
	"testing"

	"github.com/outboxrelay/relay/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestFillSpreadsKeysOverTopics: with as many keys as topics, each topic
// still gets every key, so a topic's events reach all its partitions
// (with the key taken as the event number modulo the keys, each topic had
// one key, and 1,000 topics of 8 partitions wrote to 1,000 partitions).
func TestFillSpreadsKeysOverTopics(t *testing.T) {
	cfg := Config{DatabaseURL: pgtest.Cluster(t).URL(), Topics: 8, Keys: 8, Events: 640, Writers: 2}.WithDefaults()
	e, err := newEnv(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	if written, _, err := e.fill(t.Context(), cfg.Events, 0, nil); err != nil || written != cfg.Events {
		t.Fatalf("wrote %d of %d: %v", written, cfg.Events, err)
	}
	rows, err := e.pool.Query(t.Context(), "SELECT topic, count(*), count(DISTINCT key) FROM outbox.events GROUP BY topic ORDER BY topic")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	topics := 0
	for rows.Next() {
		var topic string
		var events, keys int
		if err := rows.Scan(&topic, &events, &keys); err != nil {
			t.Fatal(err)
		}
		topics++
		if events != 80 || keys != 8 {
			t.Errorf("topic %s: %d events with %d distinct keys, want 80 with 8", topic, events, keys)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if topics != 8 {
		t.Fatalf("%d topics, want 8", topics)
	}
}
