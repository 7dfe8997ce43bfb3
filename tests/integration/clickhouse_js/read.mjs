// Reads the store with ClickHouse's own JavaScript client (@clickhouse/client, HTTP), as the user given on stdin:
// {"url", "username", "password", "database", "queries": [{"query", "format"}]}. Prints one JSON line per query:
// {"query", "format", "data" (the parsed answer), "error" (the error text or null)}.
import { createClient } from '@clickhouse/client'

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const request = JSON.parse(Buffer.concat(chunks).toString('utf8'))
const client = createClient({
  url: request.url, username: request.username, password: request.password, database: request.database,
  request_timeout: 60_000,
})
for (const { query, format } of request.queries) {
  try {
    const result = await client.query({ query, format })
    const data = await result.json()
    console.log(JSON.stringify({ query, format, data, error: null }))
  } catch (error) {
    console.log(JSON.stringify({ query, format, data: null, error: String(error.message || error) }))
  }
}
await client.close()
