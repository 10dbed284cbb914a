package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/topicname"
)

// outboxTopicSample bounds how many of the oldest outbox rows KafkaTopics
// reads for their topics.
const outboxTopicSample = 1000

// kafkaAdmin is an admin client with the sink's connection and security
// settings, its requests bounded by the Config's timeout.
func (d *Doctor) kafkaAdmin() (*kadm.Client, error) {
	opts, err := d.cfg.Kafka.ClientOpts()
	if err != nil {
		return nil, err
	}
	opts = append(opts, kgo.DialTimeout(d.cfg.Timeout), kgo.RetryTimeout(d.cfg.Timeout), kgo.RequestRetries(1))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return kadm.NewClient(cl), nil
}

// KafkaBrokers checks that the Kafka sink's brokers answer.
func (d *Doctor) KafkaBrokers(ctx context.Context) Result {
	seeds := strings.Join(d.cfg.Kafka.Brokers, ",")
	fix := "check --kafka-brokers, the network to them, and the --kafka-tls-* and --kafka-sasl-* settings"
	adm, err := d.kafkaAdmin()
	if err != nil {
		return fail(fix, "Kafka client for %s: %v", seeds, err)
	}
	defer adm.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*d.cfg.Timeout)
	defer cancel()
	m, err := adm.BrokerMetadata(ctx)
	if err != nil {
		d.kafkaDown = true
		return fail(fix, "the Kafka brokers %s do not answer: %v", seeds, err)
	}
	return pass("Kafka cluster %q answers at %s: %d brokers", m.Cluster, seeds, len(m.Brokers))
}

// kafkaTopics are the topics the sink will write: those declared, the
// progress topic in exactly-once mode, and those of the oldest waiting
// outbox rows.
func (d *Doctor) kafkaTopics(ctx context.Context) ([]string, error) {
	set := map[string]bool{}
	for _, t := range d.cfg.Topics {
		set[t] = true
	}
	if d.cfg.Kafka.TransactionalID != "" {
		set[d.cfg.Kafka.ProgressTopic] = true
	}
	if conn, err := d.db(ctx); err == nil {
		events := pgx.Identifier{d.cfg.Schema, "events"}.Sanitize()
		var present bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", events).Scan(&present); err != nil {
			return nil, err
		}
		if present {
			rows, err := conn.Query(ctx, fmt.Sprintf("SELECT DISTINCT topic FROM (SELECT topic FROM %s ORDER BY id LIMIT %d) AS e", events, outboxTopicSample))
			if err != nil {
				return nil, err
			}
			topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return nil, err
			}
			for _, t := range topics {
				if topicname.Check(t) == nil {
					set[t] = true
				}
			}
		}
	}
	var out []string
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out, nil
}

// KafkaTopics checks the topics the sink will write to: each present and
// writable, or missing and creatable (the cluster validates the creation
// without performing it) when the sink creates topics.
func (d *Doctor) KafkaTopics(ctx context.Context) Result {
	if d.kafkaDown {
		return Result{Status: Skip, Detail: "the Kafka brokers do not answer (see the kafka-brokers check)"}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*d.cfg.Timeout)
	defer cancel()
	topics, err := d.kafkaTopics(ctx)
	if err != nil {
		return fail("check that the role may read the outbox table", "reading the outbox's topics: %v", err)
	}
	if len(topics) == 0 {
		return pass("no topic to check: none declared, and no event waits in the outbox")
	}
	adm, err := d.kafkaAdmin()
	if err != nil {
		return fail("check the --kafka-* settings", "Kafka client: %v", err)
	}
	defer adm.Close()
	md, err := adm.Metadata(kadm.WithAuthorizedOps(ctx), topics...)
	if err != nil {
		return Result{Status: Skip, Detail: fmt.Sprintf("the Kafka brokers do not answer (see the kafka-brokers check): %v", err)}
	}
	var problems, fixes, creatable []string
	waiting := false // a missing topic the sink will not create
	for _, t := range topics {
		td, ok := md.Topics[t]
		var terr error
		if !ok {
			terr = kerr.UnknownTopicOrPartition
		} else {
			terr = td.Err
		}
		switch {
		case errors.Is(terr, kerr.UnknownTopicOrPartition):
			createdBySink := d.cfg.Kafka.CreateTopics || (d.cfg.Kafka.TransactionalID != "" && t == d.cfg.Kafka.ProgressTopic)
			if !createdBySink {
				problems = append(problems, t+" is missing (its events wait in the outbox)")
				waiting = true
				fixes = append(fixes, "create "+t)
				continue
			}
			parts, rf := d.cfg.Kafka.Partitions, d.cfg.Kafka.ReplicationFactor
			if t == d.cfg.Kafka.ProgressTopic && d.cfg.Kafka.TransactionalID != "" {
				parts = 1
			}
			resp, err := adm.ValidateCreateTopics(ctx, parts, rf, nil, t)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s is missing and cannot be created: %v", t, err))
				fixes = append(fixes, "create "+t+" or grant the relay CREATE on it")
				continue
			}
			creatable = append(creatable, t)
		case errors.Is(terr, kerr.TopicAuthorizationFailed):
			problems = append(problems, t+": not authorized")
			fixes = append(fixes, "grant the relay's principal DESCRIBE and WRITE on topic "+t)
		case terr != nil:
			problems = append(problems, fmt.Sprintf("%s: %v", t, terr))
			fixes = append(fixes, "check topic "+t+" on the cluster")
		case len(td.AuthorizedOperations) > 0 && !slices.Contains(td.AuthorizedOperations, kadm.OpWrite) && !slices.Contains(td.AuthorizedOperations, kadm.OpAll):
			problems = append(problems, t+": this principal may not write to it")
			fixes = append(fixes, "grant the relay's principal WRITE on topic "+t)
		}
	}
	if len(problems) > 0 {
		if waiting {
			fixes = append(fixes, "or run with --kafka-create-topics")
		}
		return fail(strings.Join(fixes, "; "), "%s", strings.Join(problems, "; "))
	}
	if len(creatable) > 0 {
		return pass("%d topics present; missing and creatable on first use: %s", len(topics)-len(creatable), strings.Join(creatable, ", "))
	}
	return pass("%d topics present and writable: %s", len(topics), strings.Join(topics, ", "))
}
