// Command inbox-consumer is an example service that consumes the relay's
// orders topic with the inbox package and ships each order exactly once:
// every event becomes one row of its shipments table, in the order of its
// key, however often the event is delivered.
//
//	go run ./examples/inbox-consumer --database-url postgres://app@db/shipping \
//		--brokers 127.0.0.1:9092 --group shipping --topic orders
//
// It migrates the inbox tables and its own table at start, and stops
// cleanly on SIGINT or SIGTERM: the records in flight are finished or
// rolled back, and the offsets of what was applied are committed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/inbox"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "inbox-consumer:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		dbURL   = flag.String("database-url", os.Getenv("DATABASE_URL"), "the consumer's PostgreSQL database")
		brokers = flag.String("brokers", "127.0.0.1:9092", "Kafka seed brokers, host:port[,host:port]")
		group   = flag.String("group", "shipping", "consumer group")
		topic   = flag.String("topic", "orders", "topic to consume")
		batch   = flag.Int("batch", 1, "records per database transaction")
		proto   = flag.String("group-protocol", "classic", "consumer group protocol: classic (JoinGroup/SyncGroup) or consumer (KIP-848, the broker assigns)")
	)
	flag.Parse()
	if *dbURL == "" {
		return errors.New("--database-url (or DATABASE_URL) is required")
	}
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(*brokers, ",")...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	switch *proto {
	case "classic":
	case "consumer":
		opts = append(opts, kgo.ServerSideBalancer())
	default:
		return fmt.Errorf("--group-protocol %q: want classic or consumer", *proto)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		return err
	}
	if err := createShipments(ctx, pool); err != nil {
		return err
	}

	c, err := inbox.New(inbox.Config{
		DB:        pool,
		Group:     *group,
		Topics:    []string{*topic},
		Kafka:     opts,
		BatchSize: *batch,
		Policy:    inbox.HoldKey,
		Logger:    log,
		Handler: func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			id, _ := inbox.HeaderEventID(r)
			var payload any
			if len(r.Value) > 0 && r.Value[0] == '{' {
				payload = string(r.Value)
			}
			_, err := tx.Exec(ctx, `INSERT INTO shipments (order_key, event_id, payload) VALUES ($1, $2, $3::jsonb)`, string(r.Key), id, payload)
			return err
		},
	})
	if err != nil {
		return err
	}
	log.Info("consuming", "group", *group, "group_protocol", *proto, "topic", *topic, "brokers", *brokers)
	start := time.Now()
	err = c.Run(ctx)
	log.Info("stopped", "after", time.Since(start).Round(time.Millisecond))
	return err
}

// createShipments creates the example's own table. Members start side by
// side, and CREATE TABLE IF NOT EXISTS is not safe against a concurrent
// creation (it can fail on the catalog's unique index): an advisory lock
// makes them take turns.
func createShipments(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('inbox-consumer: shipments'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS shipments (
		id bigserial PRIMARY KEY,
		order_key text,
		event_id text NOT NULL,
		payload jsonb,
		shipped_at timestamptz NOT NULL DEFAULT now())`)
		return err
	})
}
