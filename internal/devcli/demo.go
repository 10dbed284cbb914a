package devcli

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/cli"
	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/outbox"
)

// runDemo starts a throwaway Postgres, migrates it, runs the relay with the
// embedded broker and its Kafka listener, runs a sample service that writes
// orders and their events in one transaction, and consumes the events with
// a Kafka client, printing what arrives. Ctrl-C stops and removes it all.
func runDemo(ctx context.Context, stdio cli.IO, args []string) error {
	fs := cli.FlagSet("relay-dev demo", stdio)
	kafkaAddr := fs.String("kafka-addr", "127.0.0.1:9092", "Kafka protocol listener address")
	httpAddr := fs.String("http-addr", "127.0.0.1:9464", "metrics and health address")
	source := fs.String("source", "poll", "outbox reader: poll or cdc")
	interval := fs.Duration("interval", 500*time.Millisecond, "how often the sample service places an order")
	if err := cli.Parse(fs, args, stdio); err != nil {
		return err
	}
	if *source != "poll" && *source != "cdc" {
		return cli.Usagef("--source %q: must be poll or cdc", *source)
	}
	if *kafkaAddr == "" {
		return cli.Usagef("--kafka-addr is required: the demo's consumer reads through it")
	}
	if _, _, err := net.SplitHostPort(*kafkaAddr); err != nil {
		return cli.Usagef("--kafka-addr %q: %v", *kafkaAddr, err)
	}
	say := func(format string, a ...any) { fmt.Fprintf(stdio.Stdout, format+"\n", a...) }

	say("starting a throwaway PostgreSQL ...")
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cluster.Stop(stopCtx)
		say("stopped PostgreSQL and removed its files")
	}()
	dataDir, err := os.MkdirTemp("", "relay-demo-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)

	url := cluster.URL()
	if err := demoSchema(ctx, url); err != nil {
		return err
	}
	say("PostgreSQL (%s) is migrated: outbox.events and a sample orders table", cluster.Kind())
	if cluster.DataDir() != "" {
		say("PostgreSQL files: %s", cluster.DataDir())
	}
	say("embedded broker files: %s", dataDir)

	// The relay, on embedded defaults, in this process; the environment's
	// RELAY_* variables are the demo's, not its relay's.
	relayIO := cli.IO{Stdout: stdio.Stdout, Stderr: stdio.Stderr, Getenv: func(string) string { return "" }}
	relayArgs := []string{"--database-url", url, "--source", *source, "--data-dir", dataDir,
		"--kafka-addr", *kafkaAddr, "--http-addr", *httpAddr,
		"--partitions", "3", "--shutdown-timeout", "10s", "--log-level", "warn"}
	var wg sync.WaitGroup
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, 3)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := cli.Serve(ctx, relayIO, relayArgs); err != nil {
			errs <- fmt.Errorf("relay: %w", err)
		}
	}()
	say("relay is running: Kafka protocol on %s, metrics on http://%s/metrics", *kafkaAddr, *httpAddr)
	say("watch the same topic from another terminal with:\n  kcat -b %s -C -t orders -f 'partition %%p offset %%o key %%k: %%s\\n'", *kafkaAddr)

	go func() {
		defer wg.Done()
		if err := sampleService(ctx, url, *interval, say); err != nil {
			errs <- fmt.Errorf("sample service: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := demoConsumer(ctx, *kafkaAddr, say); err != nil {
			errs <- fmt.Errorf("consumer: %w", err)
		}
	}()
	say("press Ctrl-C to stop")
	var firstErr error
	select {
	case <-ctx.Done():
	case firstErr = <-errs:
	}
	stop()
	wg.Wait()
	say("stopped the relay, the sample service and the consumer")
	return firstErr
}

func demoSchema(ctx context.Context, url string) error {
	conn, err := pgconfig.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	m, err := migrations.New(migrations.DefaultSchema)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, conn, false); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text NOT NULL,
    amount_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// sampleService places an order every interval: the business row and its
// event in one transaction, as a real service would.
func sampleService(ctx context.Context, url string, interval time.Duration, say func(string, ...any)) error {
	conn, err := pgconfig.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	customers := []string{"ada", "grace", "linus", "barbara", "ken"}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		customer := customers[rand.IntN(len(customers))]
		amount := 100 + rand.Int64N(10_000)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, "INSERT INTO orders (customer, amount_cents) VALUES ($1, $2) RETURNING id", customer, amount).Scan(&id); err != nil {
				return err
			}
			payload := fmt.Appendf(nil, `{"order_id":%d,"customer":%q,"amount_cents":%d,"status":"placed"}`, id, customer, amount)
			_, err := outbox.Emit(ctx, tx, outbox.Event{
				Topic: "orders", Key: fmt.Sprintf("order-%d", id), Payload: payload,
				Headers: map[string]string{"source": "relay-demo"},
			})
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// demoConsumer reads the orders topic in a consumer group and prints each
// record.
func demoConsumer(ctx context.Context, addr string, say func(string, ...any)) error {
	client, err := kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.ConsumerGroup("relay-demo"),
		kgo.ConsumeTopics("orders"),
		kgo.AllowAutoTopicCreation(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// The orders topic appears with the relay's first publish; look
		// for it again within half a second rather than kgo's 5 s.
		kgo.MetadataMinAge(500*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer client.Close()
	for {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var fetchErr error
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				fetchErr = fmt.Errorf("%s/%d: %w", topic, p, err)
			}
		})
		if fetchErr != nil {
			// The relay may still be starting; the client retries.
			say("consumer: %v (retrying)", fetchErr)
			continue
		}
		fetches.EachRecord(func(r *kgo.Record) {
			eventID := ""
			for _, h := range r.Headers {
				if h.Key == "relay-event-id" {
					eventID = string(h.Value)
				}
			}
			say("consumed %s/%d@%d key=%s value=%s event-id=%s", r.Topic, r.Partition, r.Offset, r.Key, r.Value, eventID)
		})
	}
}
