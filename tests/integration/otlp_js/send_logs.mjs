// Sends log records with OpenTelemetry's JavaScript SDK and its OTLP/HTTP exporter (JSON encoding) to
// $OTLP_LOGS_URL with $OTLP_TOKEN, then prints one JSON line per record it emitted and a last line with the
// exporter's results, so tests/integration/test_otlp.py can compare what reached Kafka with what this client sent.
import { SeverityNumber } from "@opentelemetry/api-logs";
import { OTLPLogExporter } from "@opentelemetry/exporter-logs-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchLogRecordProcessor, LoggerProvider } from "@opentelemetry/sdk-logs";

const exporter = new OTLPLogExporter({
  url: process.env.OTLP_LOGS_URL,
  headers: { Authorization: `Bearer ${process.env.OTLP_TOKEN}` },
});
const results = [];
const send = exporter.export.bind(exporter);
exporter.export = (items, done) => send(items, (result) => { results.push(result.code); done(result); });

const provider = new LoggerProvider({
  resource: resourceFromAttributes({ "service.name": "storefront", "host.name": "node-1" }),
  processors: [new BatchLogRecordProcessor({ exporter })],
});
const logger = provider.getLogger("storefront.checkout");
const now = Date.now();
const records = [
  { severityNumber: SeverityNumber.INFO, severityText: "INFO", body: "cart opened", attributes: { items: 3 } },
  { severityNumber: SeverityNumber.WARN, severityText: "WARN", body: "slow payment", attributes: { "enduser.id": "u-42" } },
  { severityNumber: SeverityNumber.ERROR, severityText: "ERROR", body: { error: "declined", code: 51 } },
  { severityNumber: SeverityNumber.FATAL, severityText: "FATAL", body: "payment service down" },
];
records.forEach((record, i) => {
  const timestamp = now - 1000 + i;
  logger.emit({ ...record, timestamp });
  console.log(JSON.stringify({ ...record, timestamp }));
});
await provider.forceFlush();
await provider.shutdown();
console.log(JSON.stringify({ results }));
