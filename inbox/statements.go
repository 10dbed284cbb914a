package inbox

import "github.com/jackc/pgx/v5"

// statements are the inbox's SQL for one schema.
type statements struct {
	markProcessed string
	keyHeld       string
	insertDead    string
	listDead      string
	lockDead      string
	earlierDead   string
	deleteDead    string
	prune         string
}

func newStatements(schema string) statements {
	processed := pgx.Identifier{schema, "processed"}.Sanitize()
	dead := pgx.Identifier{schema, "dead_letters"}.Sanitize()
	const deadColumns = `id, consumer_group, event_id, topic, partition, "offset", key, value, headers, record_time, attempts, reason, held, created_at`
	return statements{
		markProcessed: `INSERT INTO ` + processed + ` (consumer_group, event_id, topic, partition, "offset")
VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		keyHeld: `SELECT id FROM ` + dead + `
WHERE consumer_group = $1 AND topic = $2 AND key = $3 ORDER BY partition, "offset" LIMIT 1`,
		insertDead: `INSERT INTO ` + dead + ` (consumer_group, event_id, topic, partition, "offset", key, value, headers, record_time, attempts, reason, held)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		listDead:    `SELECT ` + deadColumns + ` FROM ` + dead + ` WHERE consumer_group = $1 ORDER BY topic, partition, "offset" LIMIT $2`,
		lockDead:    `SELECT ` + deadColumns + ` FROM ` + dead + ` WHERE consumer_group = $1 AND id = $2 FOR UPDATE`,
		earlierDead: `SELECT id FROM ` + dead + ` WHERE consumer_group = $1 AND topic = $2 AND key = $3 AND partition = $4 AND "offset" < $5 ORDER BY "offset" LIMIT 1`,
		deleteDead:  `DELETE FROM ` + dead + ` WHERE consumer_group = $1 AND id = $2`,
		// A bounded delete: short transactions, whatever the backlog.
		prune: `DELETE FROM ` + processed + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + processed + `
	WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND "offset" < $4 AND processed_at < now() - $5::interval
	LIMIT 5000))`,
	}
}
