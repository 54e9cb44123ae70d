BEGIN TRANSACTION;
CREATE TABLE claims (job_id BIGINT PRIMARY KEY, host TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL);
INSERT INTO "claims" VALUES(42,'gpu-a',1700000121.5);
CREATE TABLE drains (host TEXT NOT NULL, slot TEXT NOT NULL,
        job_id BIGINT NOT NULL, since DOUBLE PRECISION NOT NULL, PRIMARY KEY (host, slot));
INSERT INTO "drains" VALUES('gpu-a','runnerctl/gpu-a/gpu0-3',42,1700000001.5);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, at DOUBLE PRECISION NOT NULL,
        host TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, detail TEXT NOT NULL);
INSERT INTO "events" VALUES(1,1700000000.0,'gpu-a','pause','runnerctl/gpu-a/gpu3','by carol: new fan');
INSERT INTO "events" VALUES(2,1700000001.5,'gpu-a','drain','runnerctl/gpu-a/gpu0-3','for pending job 42');
CREATE TABLE gate (host TEXT NOT NULL, gpu INTEGER NOT NULL,
        state TEXT NOT NULL, PRIMARY KEY (host, gpu));
INSERT INTO "gate" VALUES('gpu-a',5,'{"closed": true, "reason": "foreign process 77 (alice)"}');
CREATE TABLE protected (host TEXT NOT NULL, job_id BIGINT NOT NULL,
        PRIMARY KEY (host, job_id));
INSERT INTO "protected" VALUES('gpu-a',42);
CREATE TABLE toggles (host TEXT NOT NULL, target TEXT NOT NULL,
        action TEXT NOT NULL, who TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, why TEXT NOT NULL,
        PRIMARY KEY (host, target));
INSERT INTO "toggles" VALUES('gpu-a','gpu:3','pause','carol',1700000000.0,'new fan');
INSERT INTO "toggles" VALUES('gpu-b','host','drain','dave',1700000002.0,'');
CREATE TABLE users (name TEXT PRIMARY KEY, password_hash TEXT NOT NULL,
        role TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
INSERT INTO "users" VALUES('olga','$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo','operator',1700000003.0);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('events',2);
COMMIT;
