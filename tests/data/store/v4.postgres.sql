--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: claims; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.claims (
    job_id bigint NOT NULL,
    host text NOT NULL,
    expires_at double precision NOT NULL
);


--
-- Name: drains; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.drains (
    host text NOT NULL,
    slot text NOT NULL,
    job_id bigint NOT NULL,
    since double precision NOT NULL
);


--
-- Name: events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.events (
    id bigint NOT NULL,
    at double precision NOT NULL,
    host text NOT NULL,
    kind text NOT NULL,
    subject text NOT NULL,
    detail text NOT NULL
);


--
-- Name: events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.events_id_seq OWNED BY public.events.id;


--
-- Name: gate; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gate (
    host text NOT NULL,
    gpu integer NOT NULL,
    state text NOT NULL
);


--
-- Name: inventory; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.inventory (
    host text NOT NULL,
    gpus text NOT NULL,
    slots text NOT NULL,
    at double precision NOT NULL
);


--
-- Name: job_history; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.job_history (
    host text NOT NULL,
    job_id bigint NOT NULL,
    slot text NOT NULL,
    gpus text NOT NULL,
    project text NOT NULL,
    pipeline text NOT NULL,
    name text NOT NULL,
    username text NOT NULL,
    url text NOT NULL,
    queued_at double precision,
    started_at double precision NOT NULL,
    seen_at double precision NOT NULL,
    ended_at double precision,
    outcome text NOT NULL,
    util_sum double precision NOT NULL,
    util_samples integer NOT NULL,
    idle_gpu_s double precision NOT NULL,
    low_since double precision,
    unused_at double precision
);


--
-- Name: protected; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.protected (
    host text NOT NULL,
    job_id bigint NOT NULL
);


--
-- Name: schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at double precision NOT NULL
);


--
-- Name: toggles; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.toggles (
    host text NOT NULL,
    target text NOT NULL,
    action text NOT NULL,
    who text NOT NULL,
    at double precision NOT NULL,
    why text NOT NULL
);


--
-- Name: users; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.users (
    name text NOT NULL,
    password_hash text NOT NULL,
    role text NOT NULL,
    created_at double precision NOT NULL
);


--
-- Name: web_sessions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.web_sessions (
    key text NOT NULL,
    name text NOT NULL,
    via text NOT NULL,
    role text NOT NULL,
    gitlab_id bigint,
    created_at double precision NOT NULL,
    checked_at double precision NOT NULL,
    expires_at double precision NOT NULL
);


--
-- Name: events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events ALTER COLUMN id SET DEFAULT nextval('public.events_id_seq'::regclass);


--
-- Data for Name: claims; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.claims VALUES (42, 'gpu-a', 1700000121.5);


--
-- Data for Name: drains; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.drains VALUES ('gpu-a', 'runnerctl/gpu-a/gpu0-3', 42, 1700000001.5);


--
-- Data for Name: events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.events VALUES (1, 1700000000, 'gpu-a', 'pause', 'runnerctl/gpu-a/gpu3', 'by carol: new fan');
INSERT INTO public.events VALUES (2, 1700000001.5, 'gpu-a', 'drain', 'runnerctl/gpu-a/gpu0-3', 'for pending job 42');


--
-- Data for Name: gate; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gate VALUES ('gpu-a', 5, '{"closed": true, "reason": "foreign process 77 (alice)"}');


--
-- Data for Name: inventory; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.inventory VALUES ('gpu-a', '[0, 1, 2, 3, 4, 5, 6, 7]', '["runnerctl/gpu-a/gpu0", "runnerctl/gpu-a/gpu0-3"]', 1700000003);


--
-- Data for Name: job_history; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.job_history VALUES ('gpu-a', 41, 'runnerctl/gpu-a/gpu0-3', '0,1,2,3', 'ml/train', '9001', 'train', 'olga', 'https://gitlab.example.com/ml/train/-/jobs/41', 1699999000, 1699999100, 1699999900.5, 1699999950.5, 'success', 12.5, 16, 120, NULL, NULL);
INSERT INTO public.job_history VALUES ('gpu-b', 43, 'runnerctl/gpu-b/gpu5', '5', 'ml/eval', '9002', 'eval', 'pat', 'https://gitlab.example.com/ml/eval/-/jobs/43', NULL, 1700000050, 1700000090.25, NULL, 'running', 0.25, 4, 37.5, 1700000060, 1700000085);


--
-- Data for Name: protected; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.protected VALUES ('gpu-a', 42);


--
-- Data for Name: schema_migrations; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.schema_migrations VALUES (1, 'controller tables (the schema before versions)', 1795574042.6064916);
INSERT INTO public.schema_migrations VALUES (2, 'host inventory: the GPUs and slots each controller drives (toggle targets are checked against it)', 1795574042.6079578);
INSERT INTO public.schema_migrations VALUES (3, 'web sessions on the server, so that they can be ended (runnerctl.web.sessions)', 1795574042.609768);
INSERT INTO public.schema_migrations VALUES (4, 'job history (one row per job a runner of the host ran) and indexes for retention', 1795574042.6127942);


--
-- Data for Name: toggles; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.toggles VALUES ('gpu-a', 'gpu:3', 'pause', 'carol', 1700000000, 'new fan');
INSERT INTO public.toggles VALUES ('gpu-b', 'host', 'drain', 'dave', 1700000002, '');


--
-- Data for Name: users; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.users VALUES ('olga', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo', 'operator', 1700000003);


--
-- Data for Name: web_sessions; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.web_sessions VALUES ('5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e', 'olga', 'local', 'operator', NULL, 1700000004, 1700000004, 1800000000);
INSERT INTO public.web_sessions VALUES ('a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1', 'pat', 'gitlab', 'viewer', 17, 1700000005, 1700000005, 1800000000);


--
-- Name: events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.events_id_seq', 2, true);


--
-- Name: claims claims_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.claims
    ADD CONSTRAINT claims_pkey PRIMARY KEY (job_id);


--
-- Name: drains drains_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.drains
    ADD CONSTRAINT drains_pkey PRIMARY KEY (host, slot);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);


--
-- Name: gate gate_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gate
    ADD CONSTRAINT gate_pkey PRIMARY KEY (host, gpu);


--
-- Name: inventory inventory_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.inventory
    ADD CONSTRAINT inventory_pkey PRIMARY KEY (host);


--
-- Name: job_history job_history_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.job_history
    ADD CONSTRAINT job_history_pkey PRIMARY KEY (host, job_id);


--
-- Name: protected protected_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.protected
    ADD CONSTRAINT protected_pkey PRIMARY KEY (host, job_id);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: toggles toggles_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.toggles
    ADD CONSTRAINT toggles_pkey PRIMARY KEY (host, target);


--
-- Name: users users_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (name);


--
-- Name: web_sessions web_sessions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.web_sessions
    ADD CONSTRAINT web_sessions_pkey PRIMARY KEY (key);


--
-- Name: events_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX events_at ON public.events USING btree (at);


--
-- Name: job_history_ended; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX job_history_ended ON public.job_history USING btree (ended_at);


--
-- Name: job_history_started; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX job_history_started ON public.job_history USING btree (started_at);


--
-- Name: web_sessions_name; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX web_sessions_name ON public.web_sessions USING btree (name, via);


--
-- PostgreSQL database dump complete
--


